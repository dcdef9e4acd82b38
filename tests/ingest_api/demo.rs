//! Demo mode (`demo.enabled`): the browser client under /app and tokens for any user.
//! Off by default, and then none of it exists. CORS answers only the configured origins.

use chatpipe_tests::spawn_app_with;
use serde_json::json;

#[tokio::test]
async fn without_demo_mode_there_is_no_app_and_no_token_endpoint() {
    let app = spawn_app_with(|_| {}).await;
    let anonymous = app.with_auth(None);
    for path in ["/app/", "/app/app.js", "/demo/config"] {
        let res = anonymous.get(path).await;
        assert_eq!(res.status, 404, "{path}: {:?}", res.body);
    }
    let res = anonymous.post("/demo/token", json!({"userId": 10})).await;
    assert_eq!(res.status, 404, "{:?}", res.body);
}

#[tokio::test]
async fn demo_mode_serves_the_app_and_a_token_that_the_api_accepts() {
    let app = spawn_app_with(|s| {
        s.demo.enabled = true;
        s.demo.gateway_url = "ws://gateway.test/ws".into();
    })
    .await;
    let http = reqwest::Client::new();
    for (path, content_type, needle) in [
        ("/app/", "text/html", "<script type=\"module\""),
        ("/app/app.js", "text/javascript", "import"),
        ("/app/api.js", "text/javascript", "fetch("),
        ("/app/style.css", "text/css", "{"),
    ] {
        let res = http
            .get(format!("{}{path}", app.base))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200, "{path}");
        let ct = res.headers()["content-type"].to_str().unwrap().to_owned();
        assert!(ct.starts_with(content_type), "{path}: {ct}");
        let body = res.text().await.unwrap();
        assert!(body.contains(needle), "{path} lacks {needle:?}");
    }
    let redirect = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
        .get(format!("{}/app", app.base))
        .send()
        .await
        .unwrap();
    assert_eq!(redirect.status(), 308);
    assert_eq!(redirect.headers()["location"], "/app/");

    let anonymous = app.with_auth(None);
    let config = anonymous.get("/demo/config").await.expect(200);
    assert_eq!(config["gatewayUrl"], "ws://gateway.test/ws");

    let issued = anonymous
        .post("/demo/token", json!({"userId": 4711}))
        .await
        .expect(200);
    assert_eq!(issued["userId"], 4711);
    let token = issued["token"].as_str().unwrap();
    // The token is the API's own: it acts as that user.
    let as_user = app.with_auth(Some(format!("Bearer {token}")));
    let conv = as_user
        .post(
            "/v1/conversations",
            json!({"type": "GROUP", "title": "demo", "memberIds": []}),
        )
        .await
        .expect(201)["conversationId"]
        .as_i64()
        .unwrap();
    let members = app
        .user(4711)
        .get(&format!("/v1/conversations/{conv}/members"))
        .await
        .expect(200);
    assert!(members.to_string().contains("4711"), "{members}");

    // Bad input gets the API's problems.
    let zero = anonymous.post("/demo/token", json!({"userId": 0})).await;
    assert_eq!(zero.status, 422, "{:?}", zero.body);
    assert!(zero.content_type.starts_with("application/problem+json"));
    let wrong = anonymous
        .post("/demo/token", json!({"userId": "ten"}))
        .await;
    assert_eq!(wrong.status, 422, "{:?}", wrong.body);
}

#[tokio::test]
async fn cors_answers_the_allowed_origin_and_no_other() {
    let app = spawn_app_with(|s| {
        s.http.cors_allowed_origins = vec!["http://localhost:5173".into()];
    })
    .await;
    let http = reqwest::Client::new();
    let preflight = |origin: &'static str| {
        http.request(reqwest::Method::OPTIONS, format!("{}/v1/inbox", app.base))
            .header("origin", origin)
            .header("access-control-request-method", "GET")
            .header("access-control-request-headers", "authorization")
            .send()
    };
    let allowed = preflight("http://localhost:5173").await.unwrap();
    assert!(allowed.status().is_success(), "{}", allowed.status());
    let h = allowed.headers();
    assert_eq!(h["access-control-allow-origin"], "http://localhost:5173");
    let methods = h["access-control-allow-methods"].to_str().unwrap();
    assert!(
        methods.contains("POST") && methods.contains("DELETE"),
        "{methods}"
    );
    let headers = h["access-control-allow-headers"]
        .to_str()
        .unwrap()
        .to_lowercase();
    assert!(headers.contains("authorization"), "{headers}");

    let other = preflight("https://evil.example").await.unwrap();
    assert!(other.headers().get("access-control-allow-origin").is_none());

    // A real request from the allowed origin carries the header, and Retry-After is
    // readable by the page.
    let res = http
        .get(format!("{}/v1/inbox", app.base))
        .header("origin", "http://localhost:5173")
        .header("authorization", format!("Bearer {}", app.token(10)))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(
        res.headers()["access-control-allow-origin"],
        "http://localhost:5173"
    );
    let exposed = res.headers()["access-control-expose-headers"]
        .to_str()
        .unwrap()
        .to_lowercase();
    assert!(exposed.contains("retry-after"), "{exposed}");

    // Without configured origins there is no CORS at all.
    let plain = spawn_app_with(|_| {}).await;
    let res = http
        .request(reqwest::Method::OPTIONS, format!("{}/v1/inbox", plain.base))
        .header("origin", "http://localhost:5173")
        .header("access-control-request-method", "GET")
        .send()
        .await
        .unwrap();
    assert!(res.headers().get("access-control-allow-origin").is_none());
}
