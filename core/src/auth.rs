//! Bearer tokens: HS256 JWTs whose `sub` is the numeric user id. The REST API and the
//! WebSocket gateway verify them the same way.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jsonwebtoken::{decode, encode, Algorithm, DecodingKey, EncodingKey, Header, Validation};
use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};

use crate::UserId;

/// The shortest secret we accept: HS256 with fewer than 32 bytes of key is guessable.
pub const MIN_SECRET_BYTES: usize = 32;

/// Why a token was refused, in words a client developer can act on (the 401 body says
/// this and nothing of the parser's internals).
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("missing Authorization header")]
    Missing,
    #[error("Authorization header is not `Bearer <token>`")]
    NotBearer,
    #[error("the token is not a JWT (three base64url parts: header, claims, signature)")]
    Malformed,
    #[error(
        "the token's claims are not as expected: `sub` a string, `exp`, `iat` and `nbf` numbers"
    )]
    BadClaims,
    #[error("unsupported token algorithm {0:?}: tokens are signed with HS256")]
    UnsupportedAlgorithm(String),
    #[error("the token's signature does not match")]
    BadSignature,
    #[error("the token has expired")]
    Expired,
    #[error("the token is not valid yet (nbf)")]
    NotYetValid,
    #[error("the token was issued in the future (iat)")]
    IssuedInFuture,
    #[error("the token has no `{0}` claim")]
    MissingClaim(String),
    #[error("token subject {0:?} is not a positive numeric user id")]
    BadSubject(String),
    #[error("the token was rejected")]
    Rejected,
}

impl From<jsonwebtoken::errors::Error> for AuthError {
    fn from(err: jsonwebtoken::errors::Error) -> Self {
        use jsonwebtoken::errors::ErrorKind as K;
        match err.into_kind() {
            K::InvalidToken | K::Base64(_) | K::Utf8(_) => Self::Malformed,
            K::Json(_) => Self::BadClaims,
            K::InvalidSignature => Self::BadSignature,
            K::ExpiredSignature => Self::Expired,
            K::ImmatureSignature => Self::NotYetValid,
            K::MissingRequiredClaim(claim) => Self::MissingClaim(claim),
            // The algorithm is checked by name before (`check_algorithm`).
            _ => Self::Rejected,
        }
    }
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

/// The claims we read. `exp` and `sub` are required (`Validation`'s required claims;
/// optional here so a missing one is named rather than a JSON error); `iat` and `nbf`
/// are optional (RFC 7519) and checked when present.
#[derive(Debug, Serialize, Deserialize)]
struct Claims {
    sub: Option<String>,
    exp: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    iat: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    nbf: Option<u64>,
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
        validation.validate_nbf = true;
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
            sub: Some(user.to_string()),
            iat: Some(issued_at),
            exp: Some(expires_at),
            nbf: None,
        };
        encode(&Header::new(Algorithm::HS256), &claims, &self.encoding)
            .expect("HS256 signing with an in-memory key cannot fail")
    }

    pub fn verify(&self, token: &str) -> Result<UserId, AuthError> {
        check_algorithm(token)?;
        let claims = decode::<Claims>(token, &self.decoding, &self.validation)?.claims;
        if claims
            .iat
            .is_some_and(|iat| iat > unix_now() + self.validation.leeway)
        {
            return Err(AuthError::IssuedInFuture);
        }
        let sub = claims
            .sub
            .ok_or_else(|| AuthError::MissingClaim("sub".into()))?;
        sub.parse().map_err(|_| AuthError::BadSubject(sub))
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

/// The header's `alg`, read before anything else so that a token signed another way
/// (or `none`) is refused by name.
fn check_algorithm(token: &str) -> Result<(), AuthError> {
    use base64::Engine;
    #[derive(Deserialize)]
    struct Header {
        alg: String,
    }
    let (header, _) = token.split_once('.').ok_or(AuthError::Malformed)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(header)
        .map_err(|_| AuthError::Malformed)?;
    let header: Header = serde_json::from_slice(&bytes).map_err(|_| AuthError::Malformed)?;
    if header.alg == "HS256" {
        Ok(())
    } else {
        Err(AuthError::UnsupportedAlgorithm(
            header.alg.chars().take(16).collect(),
        ))
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

    /// A token with these claims, signed with `secret` (HS256).
    fn signed(secret: &str, claims: serde_json::Value) -> String {
        encode(
            &Header::new(Algorithm::HS256),
            &claims,
            &EncodingKey::from_secret(secret.as_bytes()),
        )
        .unwrap()
    }

    fn b64(s: &str) -> String {
        use base64::Engine;
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s)
    }

    #[test]
    fn iat_and_nbf_are_optional_and_checked_when_present() {
        let k = keys(SECRET);
        let now = unix_now();
        let ten = UserId::new(10).unwrap();
        let exp = now + 3600;
        let ok = |claims| k.verify(&signed(SECRET, claims));
        assert_eq!(
            ok(serde_json::json!({"sub": "10", "exp": exp})).unwrap(),
            ten
        );
        assert_eq!(
            ok(serde_json::json!({"sub": "10", "exp": exp, "iat": now - 5, "nbf": now - 5}))
                .unwrap(),
            ten
        );
        assert!(matches!(
            ok(serde_json::json!({"sub": "10", "exp": exp, "nbf": now + 600})),
            Err(AuthError::NotYetValid)
        ));
        assert!(matches!(
            ok(serde_json::json!({"sub": "10", "exp": exp, "iat": now + 600})),
            Err(AuthError::IssuedInFuture)
        ));
    }

    #[test]
    fn each_refusal_says_what_is_wrong_in_plain_words() {
        let k = keys(SECRET);
        let now = unix_now();
        let user = UserId::new(10).unwrap();
        let cases: Vec<(String, &str)> = vec![
            (k.sign(user, now - 7200, now - 3600), "the token has expired"),
            (
                keys("another-secret-another-secret-xx").issue(user, Duration::from_secs(60)),
                "the token's signature does not match",
            ),
            (
                format!("{}.{}.", b64(r#"{"alg":"none","typ":"JWT"}"#), b64(r#"{"sub":"10"}"#)),
                r#"unsupported token algorithm "none": tokens are signed with HS256"#,
            ),
            (
                signed(SECRET, serde_json::json!({"exp": now + 60})),
                "the token has no `sub` claim",
            ),
            (
                signed(SECRET, serde_json::json!({"sub": "10"})),
                "the token has no `exp` claim",
            ),
            (
                signed(SECRET, serde_json::json!({"sub": "ten", "exp": now + 60})),
                "token subject \"ten\" is not a positive numeric user id",
            ),
            (
                signed(SECRET, serde_json::json!({"sub": 10, "exp": now + 60})),
                "the token's claims are not as expected: `sub` a string, `exp`, `iat` and `nbf` numbers",
            ),
            (
                "not-a-jwt".into(),
                "the token is not a JWT (three base64url parts: header, claims, signature)",
            ),
        ];
        for (token, words) in cases {
            let err = k.verify(&token).unwrap_err();
            assert_eq!(err.to_string(), words, "for {token}");
        }
    }

    #[test]
    fn short_secrets_are_refused() {
        assert!(TokenKeys::new(&SecretString::from("short"), Duration::ZERO).is_err());
    }
}
