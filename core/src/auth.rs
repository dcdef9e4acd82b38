//! Bearer tokens: HS256 JWTs whose `sub` is the numeric user id. The REST API and the
//! WebSocket gateway verify them the same way.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jsonwebtoken::{decode, encode, Algorithm, DecodingKey, EncodingKey, Header, Validation};
use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};

use crate::UserId;

/// The shortest secret we accept: HS256 with fewer than 32 bytes of key is guessable.
pub const MIN_SECRET_BYTES: usize = 32;

#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("missing Authorization header")]
    Missing,
    #[error("Authorization header is not `Bearer <token>`")]
    NotBearer,
    #[error("token rejected: {0}")]
    Invalid(#[from] jsonwebtoken::errors::Error),
    #[error("token subject {0:?} is not a positive numeric user id")]
    BadSubject(String),
}

#[derive(Debug, thiserror::Error)]
#[error("JWT secret must be at least {MIN_SECRET_BYTES} bytes")]
pub struct WeakSecret;

/// `[auth]` of every service that verifies tokens (ingest-api, gateway).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthSettings {
    /// The HS256 secret (`JWT_SECRET`); optional so commands that verify nothing
    /// (`ingest-api migrate`) run without it.
    pub jwt_secret: Option<SecretString>,
    /// Clock skew allowed when checking `exp`.
    pub leeway_secs: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum AuthSettingsError {
    #[error("auth.jwt_secret (JWT_SECRET) is not set")]
    MissingSecret,
    #[error("auth.jwt_secret (JWT_SECRET): {0}")]
    Weak(#[from] WeakSecret),
}

impl AuthSettings {
    /// The signing keys; the error names the setting when the secret is missing or weak.
    pub fn token_keys(&self) -> Result<TokenKeys, AuthSettingsError> {
        let secret = self
            .jwt_secret
            .as_ref()
            .ok_or(AuthSettingsError::MissingSecret)?;
        Ok(TokenKeys::new(
            secret,
            Duration::from_secs(self.leeway_secs),
        )?)
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct Claims {
    sub: String,
    exp: u64,
    iat: u64,
}

/// Signs and verifies tokens with one shared secret.
#[derive(Clone)]
pub struct TokenKeys {
    encoding: EncodingKey,
    decoding: DecodingKey,
    validation: Validation,
}

impl TokenKeys {
    pub fn new(secret: &SecretString, leeway: Duration) -> Result<Self, WeakSecret> {
        let bytes = secret.expose_secret().as_bytes();
        if bytes.len() < MIN_SECRET_BYTES {
            return Err(WeakSecret);
        }
        let mut validation = Validation::new(Algorithm::HS256);
        validation.leeway = leeway.as_secs();
        validation.set_required_spec_claims(&["exp", "sub"]);
        Ok(Self {
            encoding: EncodingKey::from_secret(bytes),
            decoding: DecodingKey::from_secret(bytes),
            validation,
        })
    }

    /// A token for `user` that expires after `ttl`.
    pub fn issue(&self, user: UserId, ttl: Duration) -> String {
        let now = unix_now();
        self.sign(user, now, now + ttl.as_secs())
    }

    /// A token with explicit timestamps; tests use it to make expired tokens.
    pub fn sign(&self, user: UserId, issued_at: u64, expires_at: u64) -> String {
        let claims = Claims {
            sub: user.to_string(),
            iat: issued_at,
            exp: expires_at,
        };
        encode(&Header::new(Algorithm::HS256), &claims, &self.encoding)
            .expect("HS256 signing with an in-memory key cannot fail")
    }

    pub fn verify(&self, token: &str) -> Result<UserId, AuthError> {
        let data = decode::<Claims>(token, &self.decoding, &self.validation)?;
        data.claims
            .sub
            .parse()
            .map_err(|_| AuthError::BadSubject(data.claims.sub))
    }

    /// Verifies the value of an `Authorization` header.
    pub fn verify_header(&self, header: Option<&str>) -> Result<UserId, AuthError> {
        let value = header.ok_or(AuthError::Missing)?;
        let token = value
            .strip_prefix("Bearer ")
            .or_else(|| value.strip_prefix("bearer "))
            .ok_or(AuthError::NotBearer)?;
        self.verify(token.trim())
    }
}

pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(secret: &str) -> TokenKeys {
        TokenKeys::new(&SecretString::from(secret), Duration::ZERO).unwrap()
    }

    const SECRET: &str = "0123456789abcdef0123456789abcdef";

    #[test]
    fn issued_token_verifies_to_its_user() {
        let k = keys(SECRET);
        let user = UserId::new(10).unwrap();
        let token = k.issue(user, Duration::from_secs(60));
        assert_eq!(k.verify(&token).unwrap(), user);
        assert_eq!(
            k.verify_header(Some(&format!("Bearer {token}"))).unwrap(),
            user
        );
    }

    #[test]
    fn expired_forged_and_malformed_tokens_are_refused() {
        let k = keys(SECRET);
        let user = UserId::new(10).unwrap();
        let now = unix_now();
        assert!(k.verify(&k.sign(user, now - 7200, now - 3600)).is_err());
        let forged = keys("another-secret-another-secret-xx").issue(user, Duration::from_secs(60));
        assert!(k.verify(&forged).is_err());
        assert!(matches!(k.verify_header(None), Err(AuthError::Missing)));
        assert!(matches!(
            k.verify_header(Some("Basic abc")),
            Err(AuthError::NotBearer)
        ));
    }

    #[test]
    fn short_secrets_are_refused() {
        assert!(TokenKeys::new(&SecretString::from("short"), Duration::ZERO).is_err());
    }
}
