//! Tokens of an identity provider (issue 24): RS256 and EdDSA tokens verified with the
//! keys of a JWKS the test serves over HTTP, across a key rotation, with the number of
//! fetches the test's server counted (not ingest-api's metrics).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use chatpipe_core::auth::jwks::JwksSettings;
use chatpipe_core::auth::{unix_now, DEFAULT_AUDIENCE, DEFAULT_ISSUER};
use chatpipe_tests::jwks::{provider_token, Provider, ED, KEYS, RSA_A, RSA_B};
use chatpipe_tests::{spawn_app_with, Resp, TestApp};
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use serde_json::{json, Value};

async fn app_with_provider(url: &str, refetch_min_ms: u64) -> TestApp {
    let jwks = JwksSettings {
        url: url.to_owned(),
        refresh_secs: 3600,
        refetch_min_ms,
        fetch_timeout_ms: 2000,
    };
    spawn_app_with(|s| s.auth.jwks = Some(jwks)).await
}

async fn inbox(app: &TestApp, token: &str) -> Resp {
    app.with_auth(Some(format!("Bearer {token}")))
        .get("/v1/inbox")
        .await
}

/// Polls until the app has fetched the provider's keys once and takes `token`.
async fn until_accepted(app: &TestApp, token: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let res = inbox(app, token).await;
        if res.status == 200 {
            return;
        }
        assert!(Instant::now() < deadline, "never accepted: {:?}", res.body);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn rs256_and_eddsa_tokens_of_a_jwks_are_accepted_across_a_key_rotation() {
    let (provider, url) = Provider::start(&["rsa-a", "ed-1"]).await;
    let app = app_with_provider(&url, 0).await;
    let a = provider_token(Algorithm::RS256, "rsa-a", RSA_A, 42);
    until_accepted(&app, &a).await;
    let ed = provider_token(Algorithm::EdDSA, "ed-1", ED, 43);
    assert_eq!(inbox(&app, &ed).await.status, 200);
    // The shared secret's tokens still hold beside them.
    app.user(44).get("/v1/inbox").await.expect(200);

    // Rotation: the provider now publishes only rsa-b. Its first token is accepted
    // (the unknown kid fetched the set again); rsa-a's are refused from then on.
    provider.serve(&["rsa-b"]);
    let before = provider.fetches();
    let b = provider_token(Algorithm::RS256, "rsa-b", RSA_B, 42);
    assert_eq!(inbox(&app, &b).await.status, 200, "the new key at once");
    assert_eq!(provider.fetches(), before + 1, "one fetch for it");
    let old = inbox(&app, &a).await.problem(401);
    assert_eq!(
        old["detail"],
        "the token's key id \"rsa-a\" is not one the identity provider publishes (auth.jwks_url)"
    );

    // A provider that fails keeps the keys we hold.
    provider.failing.store(true, Ordering::SeqCst);
    let unknown = provider_token(Algorithm::RS256, "rsa-c", RSA_A, 42);
    inbox(&app, &unknown).await.problem(401);
    assert!(provider.fetches() > before + 1, "it was asked again");
    assert_eq!(inbox(&app, &b).await.status, 200, "rsa-b still held");
}

#[tokio::test]
async fn a_token_must_use_its_keys_algorithm_and_forged_key_ids_do_not_flood_the_provider() {
    let (provider, url) = Provider::start(&["rsa-a", "ed-1"]).await;
    let app = app_with_provider(&url, 60_000).await;
    until_accepted(&app, &provider_token(Algorithm::RS256, "rsa-a", RSA_A, 42)).await;

    // The Ed25519 key named by an RS256 token: refused by name.
    let crossed = provider_token(Algorithm::RS256, "ed-1", RSA_A, 42);
    let problem = inbox(&app, &crossed).await.problem(401);
    assert_eq!(
        problem["detail"],
        "the token says \"RS256\", and its key \"ed-1\" is for \"EdDSA\""
    );
    // The public key used as an HMAC secret is not the secret.
    let all: Value = serde_json::from_str(KEYS).unwrap();
    let public_n = all["rsa-a"]["n"].as_str().unwrap();
    let mut header = Header::new(Algorithm::HS256);
    header.kid = Some("rsa-a".into());
    let now = unix_now();
    let hmac = encode(
        &header,
        &json!({"sub": "42", "iat": now, "exp": now + 60, "aud": DEFAULT_AUDIENCE, "iss": DEFAULT_ISSUER}),
        &EncodingKey::from_secret(public_n.as_bytes()),
    )
    .unwrap();
    let problem = inbox(&app, &hmac).await.problem(401);
    assert_eq!(problem["detail"], "the token's signature does not match");
    // A provider token without aud is refused like any other.
    let mut header = Header::new(Algorithm::RS256);
    header.kid = Some("rsa-a".into());
    let bare = encode(
        &header,
        &json!({"sub": "42", "iat": now, "exp": now + 60, "iss": DEFAULT_ISSUER}),
        &EncodingKey::from_rsa_pem(RSA_A).unwrap(),
    )
    .unwrap();
    let problem = inbox(&app, &bare).await.problem(401);
    assert_eq!(problem["detail"], "the token has no `aud` claim");

    // 50 tokens with key ids nobody publishes, within refetch_min_ms of the fetch at
    // start: the provider is not asked again.
    let before = provider.fetches();
    for i in 0..50 {
        let forged = provider_token(Algorithm::RS256, &format!("forged-{i}"), RSA_A, 42);
        inbox(&app, &forged).await.problem(401);
    }
    assert_eq!(provider.fetches(), before);
}
