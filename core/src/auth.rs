//! Bearer tokens: HS256 JWTs whose `sub` is the numeric user id. The REST API and the
//! WebSocket gateway verify them the same way.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jsonwebtoken::{decode, encode, Algorithm, DecodingKey, EncodingKey, Header, Validation};
use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};

use crate::UserId;

/// The audience of the tokens demo mode hands out (`POST /demo/token`): refused by every
/// service that does not accept demo tokens (`auth.accept_demo_tokens`; ingest-api in demo
/// mode), so turning demo mode off ends every demo token at once.
pub const DEMO_AUDIENCE: &str = "chatpipe-demo";

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
    #[error("the token's audience (aud) is not {0:?}")]
    WrongAudience(String),
    #[error("the token's issuer (iss) is not {0:?}")]
    WrongIssuer(String),
    #[error("the token has no `{0}` claim")]
    MissingClaim(String),
    #[error("the token lives longer than {0} s (exp - iat): ask for a shorter one")]
    TooLong(u64),
    #[error("a demo token (aud \"chatpipe-demo\"), and demo mode is off here")]
    DemoToken,
    #[error("token subject {0:?} is not a positive numeric user id")]
    BadSubject(String),
    #[error("the token was rejected")]
    Rejected,
}

impl AuthError {
    fn from_jwt(err: jsonwebtoken::errors::Error, keys: &TokenKeys) -> Self {
        use jsonwebtoken::errors::ErrorKind as K;
        match err.into_kind() {
            K::InvalidAudience => Self::WrongAudience(keys.audience.clone().unwrap_or_default()),
            K::InvalidIssuer => Self::WrongIssuer(keys.issuer.clone().unwrap_or_default()),
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
    /// Clock skew allowed when checking `exp`, `nbf` and `iat`.
    pub leeway_secs: u64,
    /// When set, a token must carry this `aud` (or a list holding it).
    #[serde(default)]
    pub audience: Option<String>,
    /// When set, a token's `iss` must be exactly this.
    #[serde(default)]
    pub issuer: Option<String>,
    /// Accept the tokens of ingest-api's demo mode (`aud` "chatpipe-demo"): for the
    /// gateway of a demo (scripts/demo sets it). ingest-api accepts them while
    /// `demo.enabled`, whatever this says.
    #[serde(default)]
    pub accept_demo_tokens: bool,
    /// The longest a token may live from its `iat` to its `exp`; when set, `iat` is
    /// required. `None`: no cap.
    #[serde(default)]
    pub max_lifetime_secs: Option<u64>,
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
        Ok(
            TokenKeys::new(secret, Duration::from_secs(self.leeway_secs))?
                .with_audience(self.audience.as_deref())
                .with_issuer(self.issuer.as_deref())
                .accepting_demo(self.accept_demo_tokens)
                .with_max_lifetime(self.max_lifetime_secs),
        )
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
    /// One audience or a list (RFC 7519 4.1.3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    aud: Option<Audience>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(untagged)]
enum Audience {
    One(String),
    Many(Vec<String>),
}

impl Audience {
    fn names(&self, name: &str) -> bool {
        match self {
            Self::One(one) => one == name,
            Self::Many(many) => many.iter().any(|a| a == name),
        }
    }
}

/// Signs and verifies tokens with one shared secret.
#[derive(Clone)]
pub struct TokenKeys {
    encoding: EncodingKey,
    decoding: DecodingKey,
    validation: Validation,
    audience: Option<String>,
    issuer: Option<String>,
    accept_demo: bool,
    max_lifetime_secs: Option<u64>,
}

/// A verified token: whose it is and until when it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verified {
    pub user: UserId,
    /// `exp`, seconds since the epoch.
    pub expires_at: u64,
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
        // `aud` is checked only when configured (`with_audience`).
        validation.validate_aud = false;
        validation.set_required_spec_claims(&["exp", "sub"]);
        Ok(Self {
            encoding: EncodingKey::from_secret(bytes),
            decoding: DecodingKey::from_secret(bytes),
            validation,
            audience: None,
            issuer: None,
            accept_demo: false,
            max_lifetime_secs: None,
        })
    }

    /// Requires `aud` to name `audience` (no check when `None`).
    pub fn with_audience(mut self, audience: Option<&str>) -> Self {
        self.audience = audience.map(str::to_owned);
        self.set_audiences();
        self
    }

    /// Accepts demo tokens ([`DEMO_AUDIENCE`]) too, or refuses them (the default).
    pub fn accepting_demo(mut self, accept: bool) -> Self {
        self.accept_demo = accept;
        self.set_audiences();
        self
    }

    /// Refuses tokens that live longer than `secs` from `iat` to `exp`, and tokens
    /// without `iat` (no cap when `None`).
    pub fn with_max_lifetime(mut self, secs: Option<u64>) -> Self {
        self.max_lifetime_secs = secs;
        self
    }

    /// The cap [`TokenKeys::with_max_lifetime`] set.
    pub fn max_lifetime_secs(&self) -> Option<u64> {
        self.max_lifetime_secs
    }

    fn set_audiences(&mut self) {
        match &self.audience {
            Some(aud) => {
                let mut accepted = vec![aud.as_str()];
                if self.accept_demo {
                    accepted.push(DEMO_AUDIENCE);
                }
                self.validation.set_audience(&accepted);
                self.validation.validate_aud = true;
            }
            None => self.validation.validate_aud = false,
        }
        self.require_claims();
    }

    /// Requires `iss` to be `issuer` (no check when `None`).
    pub fn with_issuer(mut self, issuer: Option<&str>) -> Self {
        self.issuer = issuer.map(str::to_owned);
        self.validation.iss = issuer.map(|iss| std::iter::once(iss.to_owned()).collect());
        self.require_claims();
        self
    }

    fn require_claims(&mut self) {
        let mut required = vec!["exp", "sub"];
        if self.audience.is_some() {
            required.push("aud");
        }
        if self.issuer.is_some() {
            required.push("iss");
        }
        self.validation.set_required_spec_claims(&required);
    }

    /// A token for `user` that expires after `ttl`.
    pub fn issue(&self, user: UserId, ttl: Duration) -> String {
        let now = unix_now();
        self.sign(user, now, now + ttl.as_secs())
    }

    /// A demo token for `user` ([`DEMO_AUDIENCE`]), expiring after `ttl`.
    pub fn issue_demo(&self, user: UserId, ttl: Duration) -> String {
        let now = unix_now();
        self.sign_claims(user, now, now + ttl.as_secs(), Some(DEMO_AUDIENCE))
    }

    /// A token with explicit timestamps; tests use it to make expired tokens.
    pub fn sign(&self, user: UserId, issued_at: u64, expires_at: u64) -> String {
        self.sign_claims(user, issued_at, expires_at, None)
    }

    fn sign_claims(&self, user: UserId, iat: u64, exp: u64, aud: Option<&str>) -> String {
        let claims = Claims {
            sub: Some(user.to_string()),
            iat: Some(iat),
            exp: Some(exp),
            nbf: None,
            aud: aud.map(|a| Audience::One(a.to_owned())),
        };
        encode(&Header::new(Algorithm::HS256), &claims, &self.encoding)
            .expect("HS256 signing with an in-memory key cannot fail")
    }

    pub fn verify(&self, token: &str) -> Result<UserId, AuthError> {
        self.verify_until(token).map(|v| v.user)
    }

    /// Verifies `token` and says until when it holds (the gateway closes a WebSocket
    /// when its token expires).
    pub fn verify_until(&self, token: &str) -> Result<Verified, AuthError> {
        check_algorithm(token)?;
        let claims = decode::<Claims>(token, &self.decoding, &self.validation)
            .map_err(|e| AuthError::from_jwt(e, self))?
            .claims;
        if claims
            .iat
            .is_some_and(|iat| iat > unix_now() + self.validation.leeway)
        {
            return Err(AuthError::IssuedInFuture);
        }
        if !self.accept_demo && claims.aud.is_some_and(|aud| aud.names(DEMO_AUDIENCE)) {
            return Err(AuthError::DemoToken);
        }
        if let Some(max) = self.max_lifetime_secs {
            let iat = claims
                .iat
                .ok_or_else(|| AuthError::MissingClaim("iat".into()))?;
            // `iat` is no later than now (checked above), so the token holds `max` at most.
            if claims.exp.unwrap_or(u64::MAX).saturating_sub(iat) > max {
                return Err(AuthError::TooLong(max));
            }
        }
        let sub = claims
            .sub
            .ok_or_else(|| AuthError::MissingClaim("sub".into()))?;
        let user = sub.parse().map_err(|_| AuthError::BadSubject(sub))?;
        let expires_at = claims
            .exp
            .ok_or_else(|| AuthError::MissingClaim("exp".into()))?;
        Ok(Verified { user, expires_at })
    }

    /// Verifies the value of an `Authorization` header.
    pub fn verify_header(&self, header: Option<&str>) -> Result<UserId, AuthError> {
        self.verify_header_until(header).map(|v| v.user)
    }

    /// [`TokenKeys::verify_header`], saying until when the token holds.
    pub fn verify_header_until(&self, header: Option<&str>) -> Result<Verified, AuthError> {
        let value = header.ok_or(AuthError::Missing)?;
        let token = value
            .strip_prefix("Bearer ")
            .or_else(|| value.strip_prefix("bearer "))
            .ok_or(AuthError::NotBearer)?;
        self.verify_until(token.trim())
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
    fn a_demo_token_holds_only_where_demo_tokens_are_accepted() {
        let user = UserId::new(10).unwrap();
        let demo = keys(SECRET).issue_demo(user, Duration::from_secs(60));
        assert!(matches!(
            keys(SECRET).verify(&demo),
            Err(AuthError::DemoToken)
        ));
        assert_eq!(
            keys(SECRET).accepting_demo(true).verify(&demo).unwrap(),
            user
        );
        // Beside a configured audience too, in either order.
        let both = keys(SECRET)
            .accepting_demo(true)
            .with_audience(Some("chatpipe"));
        assert_eq!(both.verify(&demo).unwrap(), user);
        let audience_only = keys(SECRET).with_audience(Some("chatpipe"));
        assert!(audience_only.verify(&demo).is_err());
    }

    #[test]
    fn a_token_longer_than_the_lifetime_cap_or_without_iat_is_refused() {
        let user = UserId::new(10).unwrap();
        let capped = keys(SECRET).with_max_lifetime(Some(3600));
        let now = unix_now();
        assert_eq!(
            capped.verify(&capped.sign(user, now, now + 3600)).unwrap(),
            user
        );
        assert!(matches!(
            capped.verify(&capped.sign(user, now, now + 3601)),
            Err(AuthError::TooLong(3600))
        ));
        // An `exp` near the end of time: refused, not overflowed.
        assert!(matches!(
            capped.verify(&capped.sign(user, now, u64::MAX)),
            Err(AuthError::TooLong(3600))
        ));
        let no_iat = signed(SECRET, serde_json::json!({"sub": "10", "exp": now + 60}));
        assert!(matches!(
            capped.verify(&no_iat),
            Err(AuthError::MissingClaim(claim)) if claim == "iat"
        ));
        // Without a cap both hold.
        assert!(keys(SECRET).verify(&no_iat).is_ok());
        assert!(keys(SECRET)
            .verify(&capped.sign(user, now, u64::MAX))
            .is_ok());
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
    fn audience_and_issuer_are_checked_only_when_configured() {
        let now = unix_now();
        let claims = |extra: serde_json::Value| {
            let mut c = serde_json::json!({"sub": "10", "exp": now + 60});
            c.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            signed(SECRET, c)
        };
        let plain = keys(SECRET);
        assert!(plain
            .verify(&claims(
                serde_json::json!({"aud": "other", "iss": "anyone"})
            ))
            .is_ok());
        let strict = keys(SECRET)
            .with_audience(Some("chat"))
            .with_issuer(Some("https://id.example"));
        let good = serde_json::json!({"aud": ["web", "chat"], "iss": "https://id.example"});
        assert_eq!(
            strict.verify_until(&claims(good)).unwrap().expires_at,
            now + 60
        );
        let words = |extra| strict.verify(&claims(extra)).unwrap_err().to_string();
        assert_eq!(
            words(serde_json::json!({"aud": "web", "iss": "https://id.example"})),
            r#"the token's audience (aud) is not "chat""#
        );
        assert_eq!(
            words(serde_json::json!({"aud": "chat", "iss": "https://evil.example"})),
            r#"the token's issuer (iss) is not "https://id.example""#
        );
        assert_eq!(
            words(serde_json::json!({"iss": "https://id.example"})),
            "the token has no `aud` claim"
        );
    }

    #[test]
    fn short_secrets_are_refused() {
        assert!(TokenKeys::new(&SecretString::from("short"), Duration::ZERO).is_err());
    }
}
