//! Public keys from an identity provider's JWKS (`auth.jwks_url`: Keycloak, Auth0,
//! Cognito and the like publish one), for tokens signed with RS256, PS256, ES256 or
//! EdDSA beside the shared HS256 secret.
//!
//! The set is fetched at start and every `auth.jwks_refresh_secs`, and again when a
//! token names a key id the set does not hold (a rotation: providers publish the new key
//! before they sign with it, but a cache may be older), at most once per
//! `auth.jwks_refetch_min_ms` whatever the number of such tokens, so forged key ids
//! cannot make us hammer the provider. A failed fetch keeps the keys we have. Only
//! signing keys of an asymmetric type are taken, each with the one algorithm it names (or
//! its type's usual one): a token's `alg` must be its key's, so a public key can never
//! be used as an HMAC secret.

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, JwkSet, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey};
use serde::Deserialize;

/// The algorithms a JWKS key may be used with. Never an HMAC one.
const ASYMMETRIC: [Algorithm; 9] = [
    Algorithm::RS256,
    Algorithm::RS384,
    Algorithm::RS512,
    Algorithm::PS256,
    Algorithm::PS384,
    Algorithm::PS512,
    Algorithm::ES256,
    Algorithm::ES384,
    Algorithm::EdDSA,
];

/// Whether `alg` is one a JWKS key can verify.
pub fn is_asymmetric(alg: Algorithm) -> bool {
    ASYMMETRIC.contains(&alg)
}

/// The JWKS part of `[auth]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JwksSettings {
    /// Where the provider publishes its keys (`…/.well-known/jwks.json`).
    pub url: String,
    /// How often the set is fetched again (300 s).
    #[serde(default = "default_refresh_secs")]
    pub refresh_secs: u64,
    /// The least time between two fetches made for an unknown key id (10 s).
    #[serde(default = "default_refetch_min_ms")]
    pub refetch_min_ms: u64,
    /// How long one fetch may take (5 s).
    #[serde(default = "default_fetch_timeout_ms")]
    pub fetch_timeout_ms: u64,
}

fn default_refresh_secs() -> u64 {
    300
}

fn default_refetch_min_ms() -> u64 {
    10_000
}

fn default_fetch_timeout_ms() -> u64 {
    5_000
}

/// One verifying key and the algorithm it is for.
#[derive(Clone)]
pub(super) struct RemoteKey {
    pub(super) key: DecodingKey,
    pub(super) alg: Algorithm,
}

/// The keys of one JWKS URL. Cheap to clone.
#[derive(Clone)]
pub struct Jwks(Arc<Inner>);

struct Inner {
    settings: JwksSettings,
    client: reqwest::Client,
    keys: RwLock<Arc<HashMap<String, RemoteKey>>>,
    /// When the last fetch began; taken for the whole fetch, so concurrent callers wait
    /// for one fetch instead of making their own.
    fetched: tokio::sync::Mutex<Option<Instant>>,
}

#[derive(Debug, thiserror::Error)]
pub enum JwksError {
    #[error("auth.jwks_url: {0}")]
    Client(reqwest::Error),
    #[error("fetching the JWKS: {0}")]
    Fetch(reqwest::Error),
}

impl Jwks {
    pub fn new(settings: JwksSettings) -> Result<Self, JwksError> {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_millis(settings.fetch_timeout_ms.max(1)))
            .build()
            .map_err(JwksError::Client)?;
        Ok(Self(Arc::new(Inner {
            settings,
            client,
            keys: RwLock::new(Arc::default()),
            fetched: tokio::sync::Mutex::new(None),
        })))
    }

    /// The key named `kid`, if the set we hold has it.
    pub(super) fn key(&self, kid: &str) -> Option<RemoteKey> {
        self.0.keys.read().expect("jwks lock").get(kid).cloned()
    }

    /// How many keys the set we hold has.
    pub fn len(&self) -> usize {
        self.0.keys.read().expect("jwks lock").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Fetches the set again for a token naming a key we do not hold, unless a fetch
    /// began less than `refetch_min_ms` ago; says whether the set now has `kid`.
    pub async fn refetch_for(&self, kid: &str) -> bool {
        let mut fetched = self.0.fetched.lock().await;
        if self.key(kid).is_some() {
            return true; // another caller's fetch brought it
        }
        let min = Duration::from_millis(self.0.settings.refetch_min_ms);
        if fetched.is_some_and(|at| at.elapsed() < min) {
            metrics::counter!("jwks_fetches_total", "result" => "skipped").increment(1);
            return false;
        }
        *fetched = Some(Instant::now());
        self.fetch_logged().await;
        self.key(kid).is_some()
    }

    /// Fetches at once and then every `refresh_secs`, for as long as the process runs.
    pub fn spawn_refresh(&self) {
        let this = self.clone();
        let every = Duration::from_secs(self.0.settings.refresh_secs.max(1));
        tokio::spawn(async move {
            loop {
                {
                    let mut fetched = this.0.fetched.lock().await;
                    *fetched = Some(Instant::now());
                    this.fetch_logged().await;
                }
                tokio::time::sleep(every).await;
            }
        });
    }

    async fn fetch_logged(&self) {
        match self.fetch().await {
            Ok(n) => {
                metrics::counter!("jwks_fetches_total", "result" => "ok").increment(1);
                tracing::debug!(keys = n, "JWKS fetched");
            }
            Err(e) => {
                metrics::counter!("jwks_fetches_total", "result" => "failed").increment(1);
                tracing::warn!(error = %e, "JWKS fetch failed; keeping the keys we have");
            }
        }
    }

    /// One fetch: the set we hold becomes what the URL serves now.
    async fn fetch(&self) -> Result<usize, JwksError> {
        let set: JwkSet = self
            .0
            .client
            .get(&self.0.settings.url)
            .send()
            .await
            .and_then(reqwest::Response::error_for_status)
            .map_err(JwksError::Fetch)?
            .json()
            .await
            .map_err(JwksError::Fetch)?;
        let keys: HashMap<String, RemoteKey> = set.keys.iter().filter_map(usable).collect();
        let n = keys.len();
        metrics::gauge!("jwks_keys").set(n as f64);
        *self.0.keys.write().expect("jwks lock") = Arc::new(keys);
        Ok(n)
    }
}

/// A signing key of an asymmetric type, with a key id, and its algorithm: the one the
/// key names, or its type's usual one. Anything else is left out.
fn usable(jwk: &Jwk) -> Option<(String, RemoteKey)> {
    let kid = jwk.common.key_id.clone()?;
    if matches!(jwk.common.public_key_use, Some(ref u) if *u != PublicKeyUse::Signature) {
        return None;
    }
    let usual = match &jwk.algorithm {
        AlgorithmParameters::RSA(_) => Algorithm::RS256,
        AlgorithmParameters::EllipticCurve(ec) => match ec.curve {
            EllipticCurve::P256 => Algorithm::ES256,
            EllipticCurve::P384 => Algorithm::ES384,
            _ => return None,
        },
        AlgorithmParameters::OctetKeyPair(_) => Algorithm::EdDSA,
        // A symmetric key from a URL would let anyone who reads it sign.
        AlgorithmParameters::OctetKey(_) => return None,
    };
    let alg = match jwk.common.key_algorithm {
        Some(named) => Algorithm::from_str(&format!("{named:?}")).ok()?,
        None => usual,
    };
    if !is_asymmetric(alg) {
        return None;
    }
    let key = DecodingKey::from_jwk(jwk).ok()?;
    Some((kid, RemoteKey { key, alg }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jwk(json: serde_json::Value) -> Jwk {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn only_asymmetric_signing_keys_with_an_id_are_taken() {
        let rsa = serde_json::json!({"kty": "RSA", "kid": "r", "n": "sXch", "e": "AQAB"});
        let (kid, key) = usable(&jwk(rsa.clone())).expect("an RSA key");
        assert_eq!((kid.as_str(), key.alg), ("r", Algorithm::RS256));
        let mut pss = rsa.clone();
        pss["alg"] = "PS256".into();
        assert_eq!(usable(&jwk(pss)).unwrap().1.alg, Algorithm::PS256);
        let ed = serde_json::json!({"kty": "OKP", "kid": "e", "crv": "Ed25519",
                                    "x": "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"});
        assert_eq!(usable(&jwk(ed)).unwrap().1.alg, Algorithm::EdDSA);

        let mut no_kid = rsa.clone();
        no_kid.as_object_mut().unwrap().remove("kid");
        assert!(usable(&jwk(no_kid)).is_none());
        let mut enc = rsa.clone();
        enc["use"] = "enc".into();
        assert!(usable(&jwk(enc)).is_none());
        let mut hmac_named = rsa;
        hmac_named["alg"] = "HS256".into();
        assert!(
            usable(&jwk(hmac_named)).is_none(),
            "an HMAC alg on a public key"
        );
        let secret = serde_json::json!({"kty": "oct", "kid": "s", "k": "c2VjcmV0"});
        assert!(usable(&jwk(secret)).is_none(), "a symmetric key");
    }
}
