use chatpipe_tests::spawn_app;
use std::collections::{BTreeMap, BTreeSet};

use serde_json::{json, Value};

#[tokio::test]
async fn missing_malformed_expired_and_forged_tokens_are_401() {
    let app = spawn_app().await;
    let forged = {
        use chatpipe_core::auth::TokenKeys;
        let other = TokenKeys::new(
            &"some-other-secret-some-other-secret".to_owned().into(),
            Default::default(),
        )
        .unwrap();
        other.issue(
            chatpipe_core::UserId::new(10).unwrap(),
            std::time::Duration::from_secs(3600),
        )
    };
    let unsigned = {
        // A token with alg "none": header.payload. and no signature.
        use base64_url as b64;
        format!(
            "{}.{}.",
            b64("{\"alg\":\"none\",\"typ\":\"JWT\"}"),
            b64("{\"sub\":\"10\",\"exp\":99999999999}")
        )
    };
    let headers = [
        None,
        Some("Bearer".to_owned()),
        Some("Bearer not-a-jwt".to_owned()),
        Some(format!("Basic {}", app.token(10))),
        Some(format!("Bearer {}", app.expired_token(10))),
        Some(format!("Bearer {forged}")),
        Some(format!("Bearer {unsigned}")),
    ];
    for header in headers {
        let client = app.with_auth(header.clone());
        let res = client.get("/v1/inbox").await;
        let problem = res.problem(401);
        assert_eq!(problem["type"], "/problems/unauthorized", "for {header:?}");
        let res = client
            .post(
                "/v1/conversations",
                json!({"type": "GROUP", "memberIds": []}),
            )
            .await;
        res.problem(401);
    }
    assert_eq!(app.count("SELECT count(*) FROM conversation").await, 0);
}

fn base64_url(s: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s)
}

#[tokio::test]
async fn a_valid_token_authenticates_its_subject() {
    let app = spawn_app().await;
    let conv = app.user(77).create_group(&[]).await;
    let inbox = app.user(77).get("/v1/inbox").await.expect(200);
    assert_eq!(inbox["conversations"][0]["conversationId"], conv);
}

/// A request a member could make to each operation under `/v1/conversations/{id}`, by
/// method and path template: `None` for no body.
fn conversation_requests(seq: i64) -> BTreeMap<(&'static str, &'static str), Option<Value>> {
    BTreeMap::from([
        (("get", "/v1/conversations/{id}/messages"), None),
        (
            ("post", "/v1/conversations/{id}/messages"),
            Some(json!({"clientMsgId": uuid::Uuid::new_v4(), "body": "hi"})),
        ),
        (
            ("patch", "/v1/conversations/{id}/messages/{seq}"),
            Some(json!({"body": "edited"})),
        ),
        (("delete", "/v1/conversations/{id}/messages/{seq}"), None),
        (
            ("get", "/v1/conversations/{id}/messages/{seq}/receipts"),
            None,
        ),
        (
            ("post", "/v1/conversations/{id}/read"),
            Some(json!({"seq": seq})),
        ),
        (
            ("post", "/v1/conversations/{id}/delivered"),
            Some(json!({"seq": seq})),
        ),
        (("get", "/v1/conversations/{id}/members"), None),
        (
            ("post", "/v1/conversations/{id}/members"),
            Some(json!({"userIds": [666]})),
        ),
        (
            ("patch", "/v1/conversations/{id}/members/{userId}"),
            Some(json!({"role": "ADMIN"})),
        ),
        (("delete", "/v1/conversations/{id}/members/{userId}"), None),
        (
            (
                "put",
                "/v1/conversations/{id}/messages/{seq}/reactions/{key}",
            ),
            None,
        ),
        (
            (
                "delete",
                "/v1/conversations/{id}/messages/{seq}/reactions/{key}",
            ),
            None,
        ),
        (
            ("put", "/v1/conversations/{id}/notifications"),
            Some(json!({"level": "none"})),
        ),
        (
            ("put", "/v1/conversations/{id}/threads/{rootSeq}/follow"),
            None,
        ),
        (
            ("delete", "/v1/conversations/{id}/threads/{rootSeq}/follow"),
            None,
        ),
        (
            ("post", "/v1/conversations/{id}/threads/{rootSeq}/read"),
            Some(json!({"seq": seq})),
        ),
    ])
}

/// A non-member gets exactly what an unknown conversation gets, on every operation the
/// OpenAPI document lists under `/v1/conversations/{id}` (a new one without a request
/// here fails the test).
#[tokio::test]
async fn a_non_member_is_refused_on_every_conversation_endpoint_as_if_it_did_not_exist() {
    let app = spawn_app().await;
    let conv = app.user(10).create_group(&[20]).await;
    let seq = app.user(10).send_message(conv, "secret plans").await;
    let stranger = app.user(666);
    let unknown = conv + 1000;

    let document = app.user(10).get("/openapi.json").await.expect(200);
    let mut documented = BTreeSet::new();
    for (path, item) in document["paths"].as_object().unwrap() {
        if path.starts_with("/v1/conversations/{id}") {
            for method in item.as_object().unwrap().keys() {
                documented.insert((method.clone(), path.clone()));
            }
        }
    }
    let requests = conversation_requests(seq);
    let covered: BTreeSet<(String, String)> = requests
        .keys()
        .map(|(m, p)| (m.to_string(), p.to_string()))
        .collect();
    assert_eq!(
        covered, documented,
        "a request for every documented operation"
    );

    for id in [conv, unknown] {
        for ((method, template), body) in &requests {
            let path = template
                .replace("{id}", &id.to_string())
                .replace("{seq}", &seq.to_string())
                .replace("{rootSeq}", &seq.to_string())
                .replace("{userId}", "20")
                .replace("{key}", "%F0%9F%91%8D");
            let res = match (*method, body) {
                ("get", None) => stranger.get(&path).await,
                ("delete", None) => stranger.delete(&path).await,
                ("put", None) => stranger.put(&path).await,
                ("put", Some(b)) => stranger.put_json(&path, b.clone()).await,
                ("post", Some(b)) => stranger.post(&path, b.clone()).await,
                ("patch", Some(b)) => stranger.patch(&path, b.clone()).await,
                other => panic!("no way to send {other:?}"),
            };
            let problem = res.problem(404);
            assert_eq!(
                problem["detail"], "conversation not found",
                "{method} {path}: no hint that {id} exists"
            );
        }
    }
    let inbox = stranger.get("/v1/inbox").await.expect(200);
    assert_eq!(inbox["conversations"], json!([]));
    assert_eq!(
        app.count(&format!(
            "SELECT count(*) FROM message WHERE body = 'secret plans' AND deleted_at IS NULL
                AND edited_at IS NULL AND seq = {seq}"
        ))
        .await,
        1,
        "the message is neither edited nor deleted"
    );
    assert_eq!(app.count("SELECT count(*) FROM message").await, 1);
    assert_eq!(
        app.count("SELECT count(*) FROM message_reaction").await,
        0,
        "no reaction"
    );
    assert_eq!(
        app.count("SELECT count(*) FROM conversation_member WHERE notify_level <> 'all'")
            .await,
        0,
        "no member's notifications changed"
    );
    assert_eq!(
        app.count("SELECT count(*) FROM message_thread").await
            + app.count("SELECT count(*) FROM thread_follow").await,
        0,
        "no thread made or followed"
    );
    assert_eq!(
        app.count(
            "SELECT count(*) FROM conversation_member WHERE role = 'MEMBER' AND user_id = 20"
        )
        .await,
        1,
        "Bob is still a plain member"
    );
    assert_eq!(
        app.count("SELECT count(*) FROM conversation_member").await,
        2
    );
}

/// A standard HS256 token as other issuers make it: no `iat` (RFC 7519 makes it
/// optional), with `nbf`: accepted where no lifetime cap is set, refused by the default
/// cap (`auth.max_lifetime_secs`, 24 h), which needs `iat` to measure a token, as is one
/// that lives a second longer than the cap. And a 401 says what is wrong in plain words,
/// not the parser's.
#[tokio::test]
async fn a_standard_token_without_iat_is_accepted_and_refusals_are_plain_words() {
    use jsonwebtoken::{encode, EncodingKey, Header};
    let app = spawn_app().await;
    let uncapped = chatpipe_tests::spawn_app_with(|s| s.auth.max_lifetime_secs = None).await;
    let now = chatpipe_core::auth::unix_now();
    // Exactly these claims; `sign` adds the audience and issuer every token must name
    // (auth.audience, auth.issuer).
    let unnamed = |claims: serde_json::Value| {
        encode(
            &Header::default(),
            &claims,
            &EncodingKey::from_secret(chatpipe_tests::JWT_SECRET.as_bytes()),
        )
        .unwrap()
    };
    let sign = |mut claims: serde_json::Value| {
        claims["aud"] = chatpipe_core::auth::DEFAULT_AUDIENCE.into();
        claims["iss"] = chatpipe_core::auth::DEFAULT_ISSUER.into();
        encode(
            &Header::default(),
            &claims,
            &EncodingKey::from_secret(chatpipe_tests::JWT_SECRET.as_bytes()),
        )
        .unwrap()
    };
    let standard = sign(json!({"sub": "42", "exp": now + 600, "nbf": now - 5}));
    let bearer = Some(format!("Bearer {standard}"));
    uncapped
        .with_auth(bearer.clone())
        .get("/v1/inbox")
        .await
        .expect(200);
    let problem = app.with_auth(bearer).get("/v1/inbox").await.problem(401);
    assert_eq!(problem["detail"], "the token has no `iat` claim");
    let day = 86_400;
    let full_day = sign(json!({"sub": "42", "iat": now, "exp": now + day}));
    app.with_auth(Some(format!("Bearer {full_day}")))
        .get("/v1/inbox")
        .await
        .expect(200);

    let refusals = [
        (
            sign(json!({"sub": "42", "exp": now + 600, "nbf": now + 600})),
            "the token is not valid yet (nbf)",
        ),
        (
            format!(
                "{}.{}.",
                base64_url(r#"{"alg":"none","typ":"JWT"}"#),
                base64_url(r#"{"sub":"42","exp":99999999999}"#)
            ),
            r#"unsupported token algorithm "none": tokens are signed with HS256"#,
        ),
        (
            sign(json!({"iat": now, "exp": now + 600})),
            "the token has no `sub` claim",
        ),
        (
            sign(json!({"sub": "42", "iat": now, "exp": now + day + 1})),
            "the token lives longer than 86400 s (exp - iat): ask for a shorter one",
        ),
        (
            sign(json!({"sub": "42", "iat": now, "exp": u64::MAX})),
            "the token lives longer than 86400 s (exp - iat): ask for a shorter one",
        ),
        (
            unnamed(json!({"sub": "42", "iat": now, "exp": now + 600, "iss": "chatpipe"})),
            "the token has no `aud` claim",
        ),
        (
            unnamed(
                json!({"sub": "42", "iat": now, "exp": now + 600, "aud": "chatpipe",
                           "iss": "https://id.example"}),
            ),
            "the token's issuer (iss) is not \"chatpipe\"",
        ),
    ];
    for (token, words) in refusals {
        let problem = app
            .with_auth(Some(format!("Bearer {token}")))
            .get("/v1/inbox")
            .await
            .problem(401);
        assert_eq!(problem["detail"], words, "{problem}");
    }
}
