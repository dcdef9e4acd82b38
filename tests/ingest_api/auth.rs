use chatpipe_tests::spawn_app;
use serde_json::json;

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
        let res = client.get("/inbox").await;
        let problem = res.problem(401);
        assert_eq!(problem["type"], "/problems/unauthorized", "for {header:?}");
        let res = client
            .post("/conversations", json!({"type": "GROUP", "memberIds": []}))
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
    let inbox = app.user(77).get("/inbox").await.expect(200);
    assert_eq!(inbox["conversations"][0]["conversationId"], conv);
}

/// A non-member gets exactly what an unknown conversation gets, on every endpoint.
#[tokio::test]
async fn a_non_member_is_refused_on_every_conversation_endpoint_as_if_it_did_not_exist() {
    let app = spawn_app().await;
    let conv = app.user(10).create_group(&[20]).await;
    let seq = app.user(10).send_message(conv, "secret plans").await;
    let stranger = app.user(666);
    let unknown = conv + 1000;

    for id in [conv, unknown] {
        let answers = vec![
            stranger.get(&format!("/conversations/{id}/messages")).await,
            stranger
                .get(&format!("/conversations/{id}/messages?afterSeq=0"))
                .await,
            stranger
                .post(
                    &format!("/conversations/{id}/messages"),
                    json!({"clientMsgId": uuid::Uuid::new_v4(), "body": "hi"}),
                )
                .await,
            stranger
                .post(&format!("/conversations/{id}/read"), json!({"seq": seq}))
                .await,
            stranger
                .get(&format!("/conversations/{id}/messages/{seq}/receipts"))
                .await,
            stranger
                .post(
                    &format!("/conversations/{id}/members"),
                    json!({"userIds": [666]}),
                )
                .await,
            stranger
                .delete(&format!("/conversations/{id}/members/20"))
                .await,
            stranger
                .delete(&format!("/conversations/{id}/members/666"))
                .await,
        ];
        for res in answers {
            let problem = res.problem(404);
            assert_eq!(
                problem["detail"], "conversation not found",
                "no hint that {id} exists"
            );
        }
    }
    let inbox = stranger.get("/inbox").await.expect(200);
    assert_eq!(inbox["conversations"], json!([]));
    assert_eq!(app.count("SELECT count(*) FROM message").await, 1);
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
        .get("/inbox")
        .await
        .expect(200);
    let problem = app.with_auth(bearer).get("/inbox").await.problem(401);
    assert_eq!(problem["detail"], "the token has no `iat` claim");
    let day = 86_400;
    let full_day = sign(json!({"sub": "42", "iat": now, "exp": now + day}));
    app.with_auth(Some(format!("Bearer {full_day}")))
        .get("/inbox")
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
            .get("/inbox")
            .await
            .problem(401);
        assert_eq!(problem["detail"], words, "{problem}");
    }
}
