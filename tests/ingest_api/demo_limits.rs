//! Demo mode cannot leak: it starts only on a loopback address (unless
//! `demo.allow_remote`), its tokens live an hour at most and carry their own audience, so
//! an API without demo mode refuses them, and `/demo/token` is rate-limited.

use chatpipe_tests::{registry_url, spawn_app_beside, spawn_app_with, JWT_SECRET};
use ingest_api::configuration::Bucket;
use ingest_api::configuration::Settings;
use serde_json::json;

/// What `Application::build` says of these demo settings: `Ok(())` when it starts.
async fn start(adjust: impl FnOnce(&mut Settings)) -> Result<(), String> {
    let mut settings = Settings::defaults_with_secret(JWT_SECRET);
    settings.http.addr = "127.0.0.1:0".parse().unwrap();
    settings.admin.addr = "127.0.0.1:0".parse().unwrap();
    settings.registry.url = registry_url();
    settings.database.url = chatpipe_tests::migrated_database().await.into();
    settings.demo.enabled = true;
    adjust(&mut settings);
    match ingest_api::startup::Application::build(settings).await {
        Ok(_) => Ok(()),
        Err(err) => Err(format!("{err:#}")),
    }
}

#[tokio::test]
async fn demo_mode_is_refused_on_a_remote_address_or_with_a_day_long_token() {
    let err = start(|s| s.http.addr = "0.0.0.0:0".parse().unwrap())
        .await
        .unwrap_err();
    assert!(
        err.contains("not loopback") && err.contains("demo.allow_remote"),
        "{err}"
    );
    start(|s| {
        s.http.addr = "0.0.0.0:0".parse().unwrap();
        s.demo.allow_remote = true;
    })
    .await
    .expect("allow_remote lets it start");
    let err = start(|s| s.demo.token_ttl_secs = 86_400).await.unwrap_err();
    assert!(err.contains("demo.token_ttl_secs"), "{err}");
    start(|_| {}).await.expect("the defaults start on loopback");
}

#[tokio::test]
async fn a_demo_token_is_refused_once_demo_mode_is_off() {
    let demo = spawn_app_with(|s| s.demo.enabled = true).await;
    let issued = demo
        .with_auth(None)
        .post("/demo/token", json!({"userId": 4711}))
        .await
        .expect(200);
    assert_eq!(issued["expiresInSecs"], 3600);
    let bearer = format!("Bearer {}", issued["token"].as_str().unwrap());
    demo.with_auth(Some(bearer.clone()))
        .get("/v1/inbox")
        .await
        .expect(200);
    // The same deployment, secret and database, demo mode off.
    let plain = spawn_app_beside(&demo).await;
    let problem = plain
        .with_auth(Some(bearer))
        .get("/v1/inbox")
        .await
        .problem(401);
    assert!(
        problem["detail"].as_str().unwrap().contains("demo token"),
        "{problem}"
    );
    // Its own tokens still work.
    plain.user(4711).get("/v1/inbox").await.expect(200);
}

#[tokio::test]
async fn demo_tokens_are_rate_limited_for_all_callers_together() {
    let app = spawn_app_with(|s| {
        s.demo.enabled = true;
        s.demo.tokens = Bucket {
            rate: 1,
            per_secs: 60,
            burst: 3,
        };
    })
    .await;
    let anonymous = app.with_auth(None);
    for user in 1..=3 {
        anonymous
            .post("/demo/token", json!({"userId": user}))
            .await
            .expect(200);
    }
    let res = anonymous.post("/demo/token", json!({"userId": 4})).await;
    assert!(res.headers.contains_key("retry-after"), "{res:?}");
    assert_eq!(res.problem(429)["type"], "/problems/rate-limited");
}
