//! The one error type of the REST API. Each variant maps to a status and a
//! `/problems/<code>` problem type (docs/api.md lists them). Handlers return it and
//! never log; the request middleware logs each failed request once.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use chatpipe_core::auth::AuthError;
use chatpipe_core::problem::Problem;

use crate::store::send::SendError;
use crate::store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The request is syntactically broken: malformed JSON, a bad query or path value.
    #[error("{detail}")]
    BadRequest {
        code: &'static str,
        field: Option<String>,
        detail: String,
    },
    /// The request parses but a field's value is not acceptable.
    #[error("{field}: {detail}")]
    Invalid { field: String, detail: String },
    #[error("request body is larger than {limit} bytes")]
    BodyTooLarge { limit: usize },
    #[error("Content-Type must be application/json")]
    UnsupportedMediaType,
    #[error("unauthorized: {0}")]
    Unauthorized(#[from] AuthError),
    /// Unknown conversation, or one the caller is not a member of: the same answer, so
    /// a non-member learns nothing about what exists.
    #[error("{what} not found")]
    NotFound { what: &'static str },
    #[error("{detail}")]
    Forbidden { detail: String },
    #[error("{detail}")]
    Conflict { code: &'static str, detail: String },
    /// A block stands between the caller and whom the request would reach.
    #[error("{detail}")]
    Blocked { detail: String },
    #[error(transparent)]
    ReceiptsUnavailable(#[from] crate::receipts::ProduceError),
    #[error("database pool exhausted: {0}")]
    Unavailable(sqlx::Error),
    /// A send's batch failed or its conversation's lane is full: nothing was written.
    #[error("{0}")]
    SendUnavailable(String),
    /// Archived messages were needed and Cassandra did not answer: 503 with `Retry-After`.
    #[error("{0}")]
    ColdUnavailable(String),
    #[error("database error: {0}")]
    Database(sqlx::Error),
    /// Over the caller's token bucket (`[rate_limits]`): 429 with `Retry-After`.
    #[error("{detail}")]
    RateLimited {
        retry_after: std::time::Duration,
        detail: String,
    },
}

impl From<sqlx::Error> for ApiError {
    fn from(err: sqlx::Error) -> Self {
        match err {
            sqlx::Error::PoolTimedOut => {
                metrics::counter!("db_pool_acquire_timeouts_total").increment(1);
                Self::Unavailable(err)
            }
            other => Self::Database(other),
        }
    }
}

/// The store's refusals, as the client sees them.
impl From<StoreError> for ApiError {
    fn from(err: StoreError) -> Self {
        match err {
            StoreError::NotFound { what } => ApiError::NotFound { what },
            StoreError::Forbidden { detail } => ApiError::Forbidden { detail },
            StoreError::Conflict { code, detail } => ApiError::Conflict { code, detail },
            StoreError::Blocked { detail } => ApiError::Blocked { detail },
            StoreError::BadParameter { field, detail } => ApiError::bad_parameter(field, detail),
            StoreError::ColdUnavailable(err) => {
                metrics::counter!("cold_unavailable_total").increment(1);
                ApiError::ColdUnavailable(format!("{err:#}"))
            }
            StoreError::Database(err) => err.into(),
        }
    }
}

impl From<SendError> for ApiError {
    fn from(err: SendError) -> Self {
        match err {
            SendError::NotFound => StoreError::conversation_not_found().into(),
            SendError::Blocked => StoreError::blocked(
                "a block stands between the members of this DIRECT conversation: nobody writes in it",
            )
            .into(),
            SendError::ClientIdReused { .. } => {
                ApiError::conflict("client-msg-id-reused", err.to_string())
            }
            SendError::BadThreadRoot { .. } => ApiError::invalid("threadRootSeq", err.to_string()),
            // RootArchived: the send route looks the root up and sends again; reaching
            // here is a send that could not be finished.
            SendError::Busy { .. } | SendError::Database(_) | SendError::RootArchived { .. } => {
                ApiError::SendUnavailable(err.to_string())
            }
        }
    }
}

impl From<crate::domain::Refused> for ApiError {
    fn from(refused: crate::domain::Refused) -> Self {
        use crate::domain::Refused;
        match refused {
            Refused::Invalid { field, detail } => Self::invalid(&field, detail),
            Refused::Parameter { field, detail } => Self::bad_parameter(&field, detail),
            Refused::MemberLimit(detail) => Self::conflict("member-limit", detail),
        }
    }
}

impl ApiError {
    pub fn invalid(field: &str, detail: impl Into<String>) -> Self {
        Self::Invalid {
            field: field.to_owned(),
            detail: detail.into(),
        }
    }

    pub fn bad_parameter(field: &str, detail: impl Into<String>) -> Self {
        Self::BadRequest {
            code: "invalid-parameter",
            field: Some(field.to_owned()),
            detail: detail.into(),
        }
    }

    pub fn conflict(code: &'static str, detail: impl Into<String>) -> Self {
        Self::Conflict {
            code,
            detail: detail.into(),
        }
    }

    fn problem(&self) -> Problem {
        use StatusCode as S;
        match self {
            Self::BadRequest {
                code,
                field,
                detail,
            } => {
                let p = Problem::new(S::BAD_REQUEST, code, "Bad request", detail.clone());
                match field {
                    Some(f) => p.with_field(f.clone()),
                    None => p,
                }
            }
            Self::Invalid { field, detail } => Problem::new(
                S::UNPROCESSABLE_ENTITY,
                "invalid-field",
                "Invalid field",
                detail.clone(),
            )
            .with_field(field.clone()),
            Self::BodyTooLarge { .. } => Problem::new(
                S::PAYLOAD_TOO_LARGE,
                "body-too-large",
                "Request body too large",
                self.to_string(),
            ),
            Self::UnsupportedMediaType => Problem::new(
                S::UNSUPPORTED_MEDIA_TYPE,
                "unsupported-media-type",
                "Unsupported media type",
                self.to_string(),
            ),
            Self::Unauthorized(err) => Problem::new(
                S::UNAUTHORIZED,
                "unauthorized",
                "Unauthorized",
                err.to_string(),
            ),
            Self::NotFound { .. } => {
                Problem::new(S::NOT_FOUND, "not-found", "Not found", self.to_string())
            }
            Self::Forbidden { detail } => {
                Problem::new(S::FORBIDDEN, "forbidden", "Forbidden", detail.clone())
            }
            Self::Conflict { code, detail } => {
                Problem::new(S::CONFLICT, code, "Conflict", detail.clone())
            }
            Self::Blocked { detail } => {
                Problem::new(S::FORBIDDEN, "blocked", "Blocked", detail.clone())
            }
            Self::ReceiptsUnavailable(_) => Problem::new(
                S::SERVICE_UNAVAILABLE,
                "unavailable",
                "Service unavailable",
                "the read receipt could not be stored; retry",
            ),
            Self::Unavailable(_) => Problem::new(
                S::SERVICE_UNAVAILABLE,
                "unavailable",
                "Service unavailable",
                "the database is busy; retry with the same clientMsgId",
            ),
            Self::SendUnavailable(_) => Problem::new(
                S::SERVICE_UNAVAILABLE,
                "unavailable",
                "Service unavailable",
                "the message was not written; retry with the same clientMsgId",
            ),
            Self::ColdUnavailable(_) => Problem::new(
                S::SERVICE_UNAVAILABLE,
                "unavailable",
                "Service unavailable",
                "these messages are archived, and the archive does not answer; retry",
            ),
            Self::RateLimited { detail, .. } => Problem::new(
                S::TOO_MANY_REQUESTS,
                "rate-limited",
                "Too many requests",
                detail.clone(),
            ),
            // The cause goes to the log, not to the client.
            Self::Database(_) => Problem::new(
                S::INTERNAL_SERVER_ERROR,
                "internal",
                "Internal error",
                "the request failed and changed nothing; retry with the same clientMsgId",
            ),
        }
    }
}

/// What a 503 for an unreachable cold tier asks the client to wait: about a restart of a
/// Cassandra node, which the driver reconnects after by itself.
pub const COLD_RETRY_AFTER_SECS: u64 = 5;

/// The error's full text, attached to the response for the logging middleware.
#[derive(Debug, Clone)]
pub struct ErrorCause(pub String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = self.problem().into_response();
        if matches!(self, Self::Unauthorized(_)) {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if let Self::RateLimited { retry_after, .. } = &self {
            // Whole seconds, rounded up: a client that waits that long gets a token.
            let secs = retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0);
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs.max(1)));
        }
        if matches!(self, Self::ColdUnavailable(_)) {
            response.headers_mut().insert(
                header::RETRY_AFTER,
                HeaderValue::from(COLD_RETRY_AFTER_SECS),
            );
        }
        response
            .extensions_mut()
            .insert(ErrorCause(error_chain(&self)));
        response
    }
}

fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
