//! Bearer tokens: JWTs whose `sub` is the numeric user id, signed with HS256 and the
//! shared secret, or by an identity provider whose public keys come from a JWKS URL
//! ([`jwks`]). Every token names its audience (`aud`) and issuer (`iss`), which must be
//! the configured ones. The REST API and the WebSocket gateway verify them the same way.

pub mod jwks;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jsonwebtoken::{
    decode, decode_header, encode, Algorithm, DecodingKey, EncodingKey, Header, Validation,
};
use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};

use crate::UserId;

/// The audience of the tokens demo mode hands out (`POST /demo/token`): refused by every
/// service that does not accept demo tokens (`auth.accept_demo_tokens`; ingest-api in demo
/// mode), so turning demo mode off ends every demo token at once.
pub const DEMO_AUDIENCE: &str = "chatpipe-demo";

/// The audience and the issuer of chatpipe's own tokens where the configuration names
/// none (`auth.audience`, `auth.issuer`): what `ingest-api token` signs and what the
/// services require.
pub const DEFAULT_AUDIENCE: &str = "chatpipe";
pub const DEFAULT_ISSUER: &str = "chatpipe";

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
    #[error("unsupported token algorithm {0:?}: tokens are signed with {1}")]
    UnsupportedAlgorithm(String, &'static str),
    #[error(
        "the token's header has no `kid`: name the key of the identity provider that signed it"
    )]
    MissingKeyId,
    #[error("the token's key id {0:?} is not one the identity provider publishes (auth.jwks_url)")]
    UnknownKey(String),
    #[error("the token says {0:?}, and its key {1:?} is for {2:?}")]
    WrongKeyAlgorithm(String, String, String),
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
            // The algorithm is checked by name before (`TokenKeys::key_for`).
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
    /// A token must carry this `aud` (or a list holding it); never empty.
    #[serde(default = "default_audience")]
    pub audience: String,
    /// A token's `iss` must be exactly this; never empty.
    #[serde(default = "default_issuer")]
    pub issuer: String,
    /// An identity provider's public keys (`[auth.jwks]`): tokens it signs (RS256,
    /// PS256, ES256, EdDSA) are accepted beside HS256 ones.
    #[serde(default)]
    pub jwks: Option<jwks::JwksSettings>,
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

fn default_audience() -> String {
    DEFAULT_AUDIENCE.into()
}

fn default_issuer() -> String {
    DEFAULT_ISSUER.into()
}

#[derive(Debug, thiserror::Error)]
pub enum AuthSettingsError {
    #[error("auth.jwt_secret (JWT_SECRET) is not set")]
    MissingSecret,
    #[error("auth.jwt_secret (JWT_SECRET): {0}")]
    Weak(#[from] WeakSecret),
    #[error("auth.{0} is empty: every token must name its {0} ({1}), and it is checked")]
    Unnamed(&'static str, &'static str),
    #[error(transparent)]
    Jwks(#[from] jwks::JwksError),
}

impl AuthSettings {
    /// The signing keys; the error names the setting when the secret is missing or weak,
    /// or the audience or issuer empty. A JWKS is fetched once [`TokenKeys::start`] runs.
    pub fn token_keys(&self) -> Result<TokenKeys, AuthSettingsError> {
        let secret = self
            .jwt_secret
            .as_ref()
            .ok_or(AuthSettingsError::MissingSecret)?;
        if self.audience.trim().is_empty() {
            return Err(AuthSettingsError::Unnamed("audience", "aud"));
        }
        if self.issuer.trim().is_empty() {
            return Err(AuthSettingsError::Unnamed("issuer", "iss"));
        }
        let mut keys = TokenKeys::new(secret, Duration::from_secs(self.leeway_secs))?
            .with_audience(Some(&self.audience))
            .with_issuer(Some(&self.issuer))
            .accepting_demo(self.accept_demo_tokens)
            .with_max_lifetime(self.max_lifetime_secs);
        if let Some(settings) = &self.jwks {
            keys.jwks = Some(jwks::Jwks::new(settings.clone())?);
        }
        Ok(keys)
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
    #[serde(default, skip_serializing_if = "Option::is_none")]
    iss: Option<String>,
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

/// Signs and verifies tokens with one shared secret, and verifies those of a JWKS.
#[derive(Clone)]
pub struct TokenKeys {
    encoding: EncodingKey,
    decoding: DecodingKey,
    validation: Validation,
    jwks: Option<jwks::Jwks>,
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
            jwks: None,
            audience: None,
            issuer: None,
            accept_demo: false,
            max_lifetime_secs: None,
        }
        .with_audience(Some(DEFAULT_AUDIENCE))
        .with_issuer(Some(DEFAULT_ISSUER)))
    }

    /// Verifies the tokens signed by the keys of this JWKS too.
    pub fn with_jwks(mut self, jwks: jwks::Jwks) -> Self {
        self.jwks = Some(jwks);
        self
    }

    /// Begins fetching the JWKS, if there is one, at once and then every
    /// `refresh_secs` (in the background: until the first fetch lands, its tokens are
    /// refused 401, and each such refusal asks for a fetch).
    pub fn start(&self) {
        if let Some(jwks) = &self.jwks {
            jwks.spawn_refresh();
        }
    }

    /// Requires `aud` to name `audience` (no check when `None`; [`TokenKeys::new`]
    /// requires [`DEFAULT_AUDIENCE`]).
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
                // A demo token passes here to be refused by name after, unless accepted.
                self.validation.set_audience(&[aud.as_str(), DEMO_AUDIENCE]);
                self.validation.validate_aud = true;
            }
            None => self.validation.validate_aud = false,
        }
        self.require_claims();
    }

    /// Requires `iss` to be `issuer` (no check when `None`; [`TokenKeys::new`] requires
    /// [`DEFAULT_ISSUER`]).
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

    /// Signs with the configured audience (or `aud`) and issuer.
    fn sign_claims(&self, user: UserId, iat: u64, exp: u64, aud: Option<&str>) -> String {
        let claims = Claims {
            sub: Some(user.to_string()),
            iat: Some(iat),
            exp: Some(exp),
            nbf: None,
            aud: aud
                .or(self.audience.as_deref())
                .map(|a| Audience::One(a.to_owned())),
            iss: self.issuer.clone(),
        };
        encode(&Header::new(Algorithm::HS256), &claims, &self.encoding)
            .expect("HS256 signing with an in-memory key cannot fail")
    }

    pub fn verify(&self, token: &str) -> Result<UserId, AuthError> {
        self.verify_until(token).map(|v| v.user)
    }

    /// Verifies `token` and says until when it holds (the gateway closes a WebSocket
    /// when its token expires). A token of a JWKS key this process has not fetched yet is
    /// [`AuthError::UnknownKey`]: [`TokenKeys::verify_until_fresh`] fetches then.
    pub fn verify_until(&self, token: &str) -> Result<Verified, AuthError> {
        let claims = match self.key_for(token)? {
            None => decode::<Claims>(token, &self.decoding, &self.validation),
            Some(remote) => {
                let mut validation = self.validation.clone();
                validation.algorithms = vec![remote.alg];
                decode::<Claims>(token, &remote.key, &validation)
            }
        }
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

    /// [`TokenKeys::verify_until`], fetching the JWKS again (within its bounds) for a
    /// key id it does not hold yet: a provider's new key is accepted from its first token.
    pub async fn verify_until_fresh(&self, token: &str) -> Result<Verified, AuthError> {
        match (self.verify_until(token), &self.jwks) {
            (Err(AuthError::UnknownKey(kid)), Some(jwks)) => {
                if jwks.refetch_for(&kid).await {
                    self.verify_until(token)
                } else {
                    Err(AuthError::UnknownKey(kid))
                }
            }
            (verified, _) => verified,
        }
    }

    /// Verifies the value of an `Authorization` header.
    pub fn verify_header(&self, header: Option<&str>) -> Result<UserId, AuthError> {
        self.verify_header_until(header).map(|v| v.user)
    }

    /// [`TokenKeys::verify_header`], saying until when the token holds.
    pub fn verify_header_until(&self, header: Option<&str>) -> Result<Verified, AuthError> {
        self.verify_until(bearer(header)?)
    }

    /// [`TokenKeys::verify_header_until`] as [`TokenKeys::verify_until_fresh`] does it.
    pub async fn verify_header_until_fresh(
        &self,
        header: Option<&str>,
    ) -> Result<Verified, AuthError> {
        self.verify_until_fresh(bearer(header)?).await
    }

    /// The header's `alg` and `kid`, read before anything else so that a token signed
    /// another way (or `none`) is refused by name: `None` for HS256 (the secret), the
    /// JWKS key its `kid` names otherwise, which must be for its `alg`.
    fn key_for(&self, token: &str) -> Result<Option<jwks::RemoteKey>, AuthError> {
        let header = decode_header(token).map_err(|e| match e.into_kind() {
            jsonwebtoken::errors::ErrorKind::Json(_) => unsupported(token, self.jwks.is_some()),
            _ => AuthError::Malformed,
        })?;
        if header.alg == Algorithm::HS256 {
            return Ok(None);
        }
        let Some(jwks) = self
            .jwks
            .as_ref()
            .filter(|_| jwks::is_asymmetric(header.alg))
        else {
            return Err(unsupported(token, self.jwks.is_some()));
        };
        let kid = header.kid.ok_or(AuthError::MissingKeyId)?;
        let remote = jwks
            .key(&kid)
            .ok_or_else(|| AuthError::UnknownKey(kid.chars().take(64).collect()))?;
        if remote.alg != header.alg {
            return Err(AuthError::WrongKeyAlgorithm(
                format!("{:?}", header.alg),
                kid.chars().take(64).collect(),
                format!("{:?}", remote.alg),
            ));
        }
        Ok(Some(remote))
    }
}

/// The token of an `Authorization: Bearer <token>` header.
fn bearer(header: Option<&str>) -> Result<&str, AuthError> {
    let value = header.ok_or(AuthError::Missing)?;
    let token = value
        .strip_prefix("Bearer ")
        .or_else(|| value.strip_prefix("bearer "))
        .ok_or(AuthError::NotBearer)?;
    Ok(token.trim())
}

/// The refusal of a token whose `alg` we do not take, naming it as the header says it
/// (an unknown name, `none` included, does not parse as an `Algorithm`).
fn unsupported(token: &str, with_jwks: bool) -> AuthError {
    use base64::Engine;
    #[derive(Deserialize)]
    struct Named {
        alg: String,
    }
    let alg = token
        .split_once('.')
        .and_then(|(h, _)| {
            base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(h)
                .ok()
        })
        .and_then(|bytes| serde_json::from_slice::<Named>(&bytes).ok())
        .map(|n| n.alg.chars().take(16).collect())
        .unwrap_or_default();
    let accepted = if with_jwks {
        "HS256, or RS256/PS256/ES256/EdDSA (and their SHA-384/512 forms) by a key of auth.jwks"
    } else {
        "HS256"
    };
    AuthError::UnsupportedAlgorithm(alg, accepted)
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

    /// A token with these claims, signed with `secret` (HS256), with the default `aud`
    /// and `iss` where the claims name none.
    fn signed(secret: &str, mut claims: serde_json::Value) -> String {
        let c = claims.as_object_mut().unwrap();
        c.entry("aud").or_insert(DEFAULT_AUDIENCE.into());
        c.entry("iss").or_insert(DEFAULT_ISSUER.into());
        signed_as_is(secret, claims)
    }

    /// A token with exactly these claims.
    fn signed_as_is(secret: &str, claims: serde_json::Value) -> String {
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
            signed_as_is(SECRET, c)
        };
        let plain = keys(SECRET).with_audience(None).with_issuer(None);
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
