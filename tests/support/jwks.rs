//! An identity provider for tests: a JWKS endpoint served by the test (keys in
//! `tests/support/jwks/`), counting its own fetches, and tokens signed by its keys.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use chatpipe_core::auth::{unix_now, DEFAULT_AUDIENCE, DEFAULT_ISSUER};
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use serde_json::{json, Value};

pub const KEYS: &str = include_str!("jwks/keys.json");
pub const RSA_A: &[u8] = include_bytes!("jwks/rsa-a.pem");
pub const RSA_B: &[u8] = include_bytes!("jwks/rsa-b.pem");
pub const ED: &[u8] = include_bytes!("jwks/ed25519.pem");

/// The provider's JWKS endpoint: serves the keys named in `serving` (or a 500 when
/// `failing`) and counts the requests.
#[derive(Clone, Default)]
pub struct Provider {
    serving: Arc<Mutex<Vec<&'static str>>>,
    pub failing: Arc<AtomicBool>,
    fetches: Arc<AtomicUsize>,
}

impl Provider {
    /// Serves `serving` on a free port; the JWKS URL.
    pub async fn start(serving: &[&'static str]) -> (Self, String) {
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

    /// From now on, publishes only the keys `kids` (of keys.json).
    pub fn serve(&self, kids: &[&'static str]) {
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

    /// Requests this endpoint has answered.
    pub fn fetches(&self) -> usize {
        self.fetches.load(Ordering::SeqCst)
    }
}

/// A token for `user` signed by the provider's key `kid` with `alg`, valid 10 minutes.
pub fn provider_token(alg: Algorithm, kid: &str, pem: &[u8], user: i64) -> String {
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
