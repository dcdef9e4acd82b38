use chatpipe_tests::spawn_app;
use sqlx::Connection;

#[tokio::test]
async fn health_readiness_and_metrics_answer_without_a_token() {
    let app = spawn_app().await;
    let anon = app.with_auth(None);
    assert_eq!(anon.get("/healthz").await.expect(200)["status"], "ok");
    assert_eq!(anon.get("/readyz").await.expect(200)["status"], "ready");

    let conv = app.user(10).create_group(&[20]).await;
    app.user(10).send_message(conv, "counted").await;
    let text = app
        .http
        .get(format!("{}/metrics", app.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for name in [
        "http_requests_total",
        "http_request_duration_seconds",
        "messages_sent_total",
        "outbox_events_written_total",
        "db_pool_connections",
        "db_pool_max_connections",
    ] {
        assert!(text.contains(name), "{name} missing from /metrics");
    }
    assert!(
        text.contains("route=\"/conversations/{id}/messages\""),
        "requests are labelled by route"
    );
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
}
