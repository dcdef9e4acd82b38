//! Tokens of an identity provider (issue 24): RS256 and EdDSA tokens verified with the
//! keys of a JWKS the test serves over HTTP, across a key rotation, with the number of
//! fetches the test's server counted (not ingest-api's metrics).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use chatpipe_core::auth::jwks::JwksSettings;
use chatpipe_core::auth::{unix_now, DEFAULT_AUDIENCE, DEFAULT_ISSUER};
use chatpipe_tests::{spawn_app_with, Resp, TestApp};
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use serde_json::{json, Value};

const KEYS: &str = include_str!("../support/jwks/keys.json");
const RSA_A: &[u8] = include_bytes!("../support/jwks/rsa-a.pem");
const RSA_B: &[u8] = include_bytes!("../support/jwks/rsa-b.pem");
const ED: &[u8] = include_bytes!("../support/jwks/ed25519.pem");

/// The provider's JWKS endpoint: serves the keys named in `serving` (or a 500 when
/// `failing`) and counts the requests.
#[derive(Clone, Default)]
struct Provider {
    serving: Arc<Mutex<Vec<&'static str>>>,
    failing: Arc<std::sync::atomic::AtomicBool>,
    fetches: Arc<AtomicUsize>,
}

impl Provider {
    async fn start(serving: &[&'static str]) -> (Self, String) {
        let provider = Self::default();
        provider.serve(serving);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/certs", listener.local_addr().unwrap());
        let p = provider.clone();
        let app = axum::Router::new().route(
            "/certs",
            axum::routing::get(move || {
                let p = p.clone();
                async move { p.answer() }
            }),
        );
        tokio::spawn(async move { axum::serve(listener, app).await });
        (provider, url)
    }

    fn serve(&self, kids: &[&'static str]) {
        *self.serving.lock().unwrap() = kids.to_vec();
    }

    fn answer(&self) -> Response {
        self.fetches.fetch_add(1, Ordering::SeqCst);
        if self.failing.load(Ordering::SeqCst) {
            return StatusCode::INTERNAL_SERVER_ERROR.into_response();
        }
        let all: Value = serde_json::from_str(KEYS).unwrap();
        let keys: Vec<Value> = self
            .serving
            .lock()
            .unwrap()
            .iter()
            .map(|kid| all[*kid].clone())
            .collect();
        axum::Json(json!({ "keys": keys })).into_response()
    }

    fn fetches(&self) -> usize {
        self.fetches.load(Ordering::SeqCst)
    }
}

async fn app_with_provider(url: &str, refetch_min_ms: u64) -> TestApp {
    let jwks = JwksSettings {
        url: url.to_owned(),
        refresh_secs: 3600,
        refetch_min_ms,
        fetch_timeout_ms: 2000,
    };
    spawn_app_with(|s| s.auth.jwks = Some(jwks)).await
}

/// A token for `user` signed by the provider's key `kid` with `alg`.
fn provider_token(alg: Algorithm, kid: &str, pem: &[u8], user: i64) -> String {
    let key = match alg {
        Algorithm::EdDSA => EncodingKey::from_ed_pem(pem),
        _ => EncodingKey::from_rsa_pem(pem),
    }
    .unwrap();
    let mut header = Header::new(alg);
    header.kid = Some(kid.to_owned());
    let now = unix_now();
    let claims = json!({"sub": user.to_string(), "iat": now, "exp": now + 600,
                        "aud": DEFAULT_AUDIENCE, "iss": DEFAULT_ISSUER});
    encode(&header, &claims, &key).unwrap()
}

async fn inbox(app: &TestApp, token: &str) -> Resp {
    app.with_auth(Some(format!("Bearer {token}")))
        .get("/inbox")
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
    app.user(44).get("/inbox").await.expect(200);

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
