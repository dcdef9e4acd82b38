use chatpipe_tests::{metric_sum, spawn_app, spawn_app_with};
use sqlx::Connection;

/// `name`'s samples with `labels` summed (0 when there are none).
fn sample(text: &str, name: &str, labels: &[&str]) -> f64 {
    metric_sum(text, name, labels).unwrap_or(0.0)
}

#[tokio::test]
async fn health_and_readiness_answer_without_a_token_and_metrics_only_on_the_admin_listener() {
    let app = spawn_app_with(|s| s.database.max_connections = 7).await;
    let anon = app.with_auth(None);
    assert_eq!(anon.get("/healthz").await.expect(200)["status"], "ok");
    assert_eq!(anon.get("/readyz").await.expect(200)["status"], "ready");
    anon.get("/metrics").await.problem(404);
    let admin_ready: serde_json::Value = app
        .http
        .get(format!("{}/readyz", app.admin))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(admin_ready["status"], "ready");

    let conv = app.user(10).create_group(&[20]).await;
    // Other tests in this process count too: compare before and after this one's send.
    let before = app.metrics().await;
    app.user(10).send_message(conv, "counted").await;
    let after = app.metrics().await;
    let grew =
        |name: &str, labels: &[&str]| sample(&after, name, labels) - sample(&before, name, labels);
    let send_route = [
        "route=\"/v1/conversations/{id}/messages\"",
        "method=\"POST\"",
        "status=\"201\"",
    ];
    assert!(grew("messages_sent_total", &[]) >= 1.0, "{after}");
    assert!(grew("outbox_events_written_total", &[]) >= 1.0, "{after}");
    assert!(
        grew("http_requests_total", &send_route) >= 1.0,
        "requests are counted by route, method and status: {after}"
    );
    assert!(
        grew("http_request_duration_seconds_count", &send_route[..2]) >= 1.0,
        "and timed: {after}"
    );
    // The pool gauges are set from the pool that serves /metrics. Every app of this test
    // process shares one recorder, so another test's scrape may land in between: read
    // until this app's figures show (a deadline, not a sleep).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let text = app.metrics().await;
        let (max, open) = (
            sample(&text, "db_pool_max_connections", &[]),
            sample(&text, "db_pool_connections", &[]),
        );
        if max == 7.0 && (1.0..=7.0).contains(&open) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "db_pool_max_connections {max} (configured 7), db_pool_connections {open}"
        );
    }
}

#[tokio::test]
async fn readiness_fails_when_the_database_is_gone() {
    let app = spawn_app().await;
    let db: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    // From outside: forbid new connections to the app's database and end the open ones.
    let mut admin = sqlx::PgConnection::connect(&chatpipe_tests::server_url())
        .await
        .unwrap();
    sqlx::query(&format!(
        "ALTER DATABASE \"{db}\" WITH ALLOW_CONNECTIONS false"
    ))
    .execute(&mut admin)
    .await
    .unwrap();
    sqlx::query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1")
        .bind(&db)
        .execute(&mut admin)
        .await
        .unwrap();
    let problem = app.with_auth(None).get("/readyz").await.problem(503);
    assert_eq!(problem["type"], "/problems/not-ready");
    assert_eq!(
        problem["detail"], "the database is not answering",
        "the public listener does not tell the database's error"
    );
    // The admin listener says why.
    let res = app
        .http
        .get(format!("{}/readyz", app.admin))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 503);
    let detailed: serde_json::Value = res.json().await.unwrap();
    let detail = detailed["detail"].as_str().unwrap();
    assert!(detail.starts_with("database"), "{detail}");
    assert_ne!(detail, "the database is not answering");
}

/// Invariant 3, the durable ack: every connection of the API's pool commits with
/// `synchronous_commit = on`, even in a database whose default is `off`, and a
/// configuration asking for `off` is refused.
#[tokio::test]
async fn every_connection_commits_durably_even_where_the_database_default_is_off() {
    let url = chatpipe_tests::fresh_database().await;
    let db = url.rsplit('/').next().unwrap().to_owned();
    let mut admin = sqlx::PgConnection::connect(&chatpipe_tests::server_url())
        .await
        .unwrap();
    sqlx::query(&format!(
        "ALTER DATABASE \"{db}\" SET synchronous_commit = off"
    ))
    .execute(&mut admin)
    .await
    .unwrap();
    let mut plain = sqlx::PgConnection::connect(&url).await.unwrap();
    let default: String = sqlx::query_scalar("SHOW synchronous_commit")
        .fetch_one(&mut plain)
        .await
        .unwrap();
    assert_eq!(default, "off", "the database's own default is off");

    let mut settings =
        ingest_api::configuration::Settings::defaults_with_secret(chatpipe_tests::JWT_SECRET);
    settings.database.url = url.clone().into();
    settings.database.min_connections = 3;
    // The pool Application::build serves requests from.
    let pool = ingest_api::startup::connect(&settings.database)
        .await
        .unwrap();
    let mut sessions = Vec::new();
    for _ in 0..3 {
        sessions.push(pool.acquire().await.unwrap());
    }
    for conn in &mut sessions {
        let level: String = sqlx::query_scalar("SHOW synchronous_commit")
            .fetch_one(&mut **conn)
            .await
            .unwrap();
        assert_eq!(level, "on");
    }

    let file = std::env::temp_dir().join(format!("sync-off-{}.toml", uuid::Uuid::new_v4()));
    std::fs::write(&file, "[database]\nsynchronous_commit = \"off\"\n").unwrap();
    let refused = ingest_api::configuration::Settings::load(Some(&file))
        .expect_err("synchronous_commit = off is refused");
    std::fs::remove_file(&file).unwrap();
    assert!(
        refused.to_string().contains("synchronous_commit"),
        "the error names the key: {refused}"
    );
}

/// What the apps of this test binary log. A subscriber scoped to one test's thread
/// misses lines now and then (tracing caches each call site's interest globally, and the
/// other tests' threads have none), so this one is the binary's global subscriber, set
/// by the first test that asks.
#[derive(Clone, Default)]
struct Logs(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn captured_logs() -> Logs {
    static LOGS: std::sync::OnceLock<Logs> = std::sync::OnceLock::new();
    LOGS.get_or_init(|| {
        let logs = Logs::default();
        tracing::subscriber::set_global_default(
            tracing_subscriber::fmt()
                .with_writer(logs.clone())
                .with_ansi(false)
                .with_max_level(tracing::Level::INFO)
                .finish(),
        )
        .expect("no other global subscriber in the ingest_api tests");
        logs
    })
    .clone()
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Logs {
    type Writer = Logs;
    fn make_writer(&'a self) -> Logs {
        self.clone()
    }
}

/// Every answer carries `x-request-id`: the client's, or a new UUID for none or a bad
/// one; a problem body carries the same as `requestId`, and so does the app's log line
/// of the refused request.
#[tokio::test]
async fn every_answer_carries_its_request_id_in_the_header_the_problem_and_the_log() {
    let logs = captured_logs();
    let app = spawn_app().await;
    let res = app.user(10).get("/v1/inbox").await;
    let made = res.headers["x-request-id"].to_str().unwrap().to_owned();
    uuid::Uuid::parse_str(&made).expect("a request id made for the request is a UUID");
    res.expect(200);

    let ask = |id: String| {
        app.http
            .get(format!("{}/v1/conversations/999/messages", app.base))
            .bearer_auth(app.token(10))
            .header("x-request-id", id)
            .send()
    };
    let res = ask("trace-me-42".into()).await.unwrap();
    assert_eq!(res.status(), 404);
    assert_eq!(res.headers()["x-request-id"], "trace-me-42");
    let problem: serde_json::Value = res.json().await.unwrap();
    assert_eq!(problem["requestId"], "trace-me-42", "{problem}");
    let text = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    assert!(
        text.lines()
            .any(|l| l.contains("request refused") && l.contains("request_id=trace-me-42")),
        "the refused request's log line names its id:\n{text}"
    );

    for bad in ["x".repeat(129), "with space".into()] {
        let res = ask(bad.clone()).await.unwrap();
        let given = res.headers()["x-request-id"].to_str().unwrap().to_owned();
        assert!(
            uuid::Uuid::parse_str(&given).is_ok(),
            "{bad:?} replaced: {given}"
        );
    }
}
