//! Extractors that turn bad input into an `ApiError` naming the field at fault.

use std::collections::HashMap;
use std::str::FromStr;

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Path, Request};
use axum::http::request::Parts;
use axum::http::{header, StatusCode};
use chatpipe_core::{ConversationId, UserId};
use serde::de::DeserializeOwned;

use crate::error::ApiError;
use crate::state::AppState;

/// The authenticated caller, from `Authorization: Bearer <JWT>`.
#[derive(Debug, Clone, Copy)]
pub struct Caller(pub UserId);

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let header = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        let verified = state.keys.verify_header_until_fresh(header).await?;
        Ok(Caller(verified.user))
    }
}

/// Whether a client's identifier from a header (an `Idempotency-Key`, an
/// `x-request-id`) is 1 to `max` visible ASCII characters: what the service accepts,
/// stores and logs as given.
pub fn is_token(text: &str, max: usize) -> bool {
    !text.is_empty() && text.len() <= max && text.bytes().all(|b| b.is_ascii_graphic())
}

/// The `Idempotency-Key` header of a creating request, if any: 1 to
/// `limits.max_idempotency_key_chars` visible ASCII characters (a UUID, say), bare or as
/// a quoted string (the IETF draft's form). Anything else is 400 naming the header.
pub struct IdempotencyKey(pub Option<String>);

impl FromRequestParts<AppState> for IdempotencyKey {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        const FIELD: &str = "Idempotency-Key";
        let Some(value) = parts.headers.get(FIELD) else {
            return Ok(Self(None));
        };
        let max = state.limits.max_idempotency_key_chars;
        let text = value.to_str().unwrap_or_default();
        let key = text
            .strip_prefix('"')
            .and_then(|t| t.strip_suffix('"'))
            .unwrap_or(text);
        if !is_token(key, max) {
            return Err(ApiError::bad_parameter(
                FIELD,
                format!("must be 1 to {max} visible ASCII characters (a UUID, say)"),
            ));
        }
        Ok(Self(Some(key.to_owned())))
    }
}

/// A JSON body. Syntax errors are 400, values of the wrong type or shape are 422 with
/// the JSON path of the field, bodies over `http.max_request_bytes` are 413.
pub struct Json<T>(pub T);

impl<T: DeserializeOwned> FromRequest<AppState> for Json<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, ApiError> {
        let is_json = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .map(|mime| {
                let mime = mime.trim();
                mime.eq_ignore_ascii_case("application/json") || mime.ends_with("+json")
            })
            .unwrap_or(false);
        if !is_json {
            return Err(ApiError::UnsupportedMediaType);
        }
        let bytes = Bytes::from_request(req, state).await.map_err(|rejection| {
            if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                metrics::counter!("http_body_limit_rejections_total").increment(1);
                ApiError::BodyTooLarge {
                    limit: state.max_request_bytes,
                }
            } else {
                ApiError::BadRequest {
                    code: "malformed-json",
                    field: None,
                    detail: rejection.body_text(),
                }
            }
        })?;
        parse_json(&bytes).map(Json)
    }
}

/// Parses a JSON object body: syntax first (400), then shape and types (422, naming
/// the JSON path of the field at fault).
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let malformed = |detail: String| ApiError::BadRequest {
        code: "malformed-json",
        field: None,
        detail,
    };
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(malformed(
            "request body is empty; expected a JSON object".into(),
        ));
    }
    let value: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|err| malformed(format!("malformed JSON: {err}")))?;
    if !value.is_object() {
        return Err(ApiError::invalid("(body)", "must be a JSON object"));
    }
    serde_path_to_error::deserialize(value).map_err(|err| {
        let path = err.path().to_string();
        let detail = err.into_inner().to_string();
        let field = if path == "." {
            named_field(&detail).unwrap_or_else(|| "(body)".into())
        } else {
            path
        };
        ApiError::Invalid { field, detail }
    })
}

/// serde names a missing or unknown field only in its message: "missing field `x`".
fn named_field(message: &str) -> Option<String> {
    let start = message.find('`')? + 1;
    let len = message[start..].find('`')?;
    Some(message[start..start + len].to_owned())
}

/// Query parameters; a value that does not parse is 400 naming the parameter.
pub struct Query<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for Query<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, ApiError> {
        let query = parts.uri.query().unwrap_or_default();
        let de = serde_urlencoded::Deserializer::new(form_urlencoded::parse(query.as_bytes()));
        serde_path_to_error::deserialize(de)
            .map(Query)
            .map_err(|err| {
                let path = err.path().to_string();
                let inner = err.into_inner().to_string();
                let field = if path == "." {
                    named_field(&inner)
                } else {
                    Some(path)
                };
                let detail = match &field {
                    Some(f) => format!("query parameter {f}: {inner}"),
                    None => inner,
                };
                ApiError::BadRequest {
                    code: "invalid-parameter",
                    field,
                    detail,
                }
            })
    }
}

/// Path segments by name, parsed on demand so the error names the segment.
pub struct PathParams(HashMap<String, String>);

impl PathParams {
    pub fn get<T: FromStr<Err = String>>(&self, name: &str) -> Result<T, ApiError> {
        let raw = self.0.get(name).map(String::as_str).unwrap_or_default();
        raw.parse()
            .map_err(|detail| ApiError::bad_parameter(name, detail))
    }
}

/// The `{id}` segment of a conversation-scoped route, parsed before the body is read
/// so that `/conversations/abc/...` is refused for its path, whatever the body.
pub struct ConversationPath(pub ConversationId);

impl<S: Send + Sync> FromRequestParts<S> for ConversationPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let params = PathParams::from_request_parts(parts, state).await?;
        params.get("id").map(ConversationPath)
    }
}

impl<S: Send + Sync> FromRequestParts<S> for PathParams {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let Path(map) = Path::<HashMap<String, String>>::from_request_parts(parts, state)
            .await
            .map_err(|rejection| ApiError::BadRequest {
                code: "invalid-parameter",
                field: None,
                detail: rejection.body_text(),
            })?;
        Ok(PathParams(map))
    }
}
