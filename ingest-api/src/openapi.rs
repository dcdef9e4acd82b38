//! The OpenAPI 3.1 document of the REST API, generated from the code: each handler
//! carries a `#[utoipa::path]` annotation next to it, its request and answer types derive
//! `ToSchema`, and [`crate::routes::router`] registers handlers through utoipa-axum's
//! `routes!`, which takes a route's path and method from that same annotation. A route
//! is in the document exactly when it is served. `GET /openapi.json` (routes/health.rs)
//! serves it; the contract tests lint it and call every operation in it
//! (tests/contracts/). This module only describes; the routes assemble.

use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{IntoResponses, Modify, OpenApi, ToSchema};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "chatpipe ingest-api",
        description = "Send, page history, mark read and delivered, list the inbox, sync. \
            Every call but the operations ones needs `Authorization: Bearer <JWT>`. \
            Errors are `application/problem+json` (RFC 9457); each answer's description \
            names the problem `type`s it can carry. An unknown path answers 404 \
            `/problems/not-found`, a known path with another method 405 \
            `/problems/method-not-allowed`. Every API path is under `/v1`; an old client's \
            path without it answers 308 to the same path under `/v1` \
            (`/problems/moved`, `Deprecation: true`) until the next release. Every answer \
            carries `x-request-id`: the client's (1 to 128 visible ASCII characters) or one \
            made for it; problem bodies carry it as `requestId`, and the service's log \
            lines of the request as `request_id`. Reference: docs/api.md; pushes over the \
            WebSocket: docs/protocol.md and docs/asyncapi.yaml.",
        license(name = "Apache-2.0", identifier = "Apache-2.0"),
    ),
    modifiers(&BearerAuth),
    security(("bearer" = [])),
    tags(
        (name = "conversations", description = "Groups, DIRECT conversations and their members"),
        (name = "messages", description = "Send, edit, delete, page history"),
        (name = "read state", description = "Read and delivered watermarks, receipts"),
        (name = "inbox", description = "The caller's conversations, and everything that changed"),
        (name = "blocks", description = "Users the caller blocked"),
        (name = "operations", description = "Liveness and readiness (no token)"),
        (name = "demo", description = "Only with demo.enabled: never where real users are"),
    ),
    components(schemas(ProblemBody))
)]
pub struct ApiDoc;

/// The bearer JWT every API call carries.
struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .bearer_format("JWT")
                    .description(Some(
                        "HS256 with the shared secret, or RS256/PS256/ES256/EdDSA by a key of \
                         `[auth.jwks]`; `sub` is the user id, `aud` and `iss` the configured \
                         ones. `ingest-api token --user N` prints one.",
                    ))
                    .build(),
            ),
        );
    }
}

/// An RFC 9457 problem: the body of every 4xx and 5xx.
#[derive(ToSchema)]
#[schema(as = Problem)]
#[allow(dead_code)] // a description of `chatpipe_core::problem::Problem`'s JSON
pub struct ProblemBody {
    /// `/problems/<code>`, e.g. `/problems/invalid-field`.
    #[schema(rename = "type")]
    kind: String,
    title: String,
    status: u16,
    detail: String,
    /// The JSON path, query parameter or path segment at fault.
    field: Option<String>,
    /// The request's `x-request-id` (the client's, or one made for it), as the
    /// service's log lines of the request carry it.
    #[schema(rename = "requestId")]
    request_id: Option<String>,
}

/// What any call with a token can answer besides its own results.
#[derive(IntoResponses)]
#[allow(dead_code)]
pub enum Common {
    /// `/problems/invalid-parameter`: a path segment or query parameter does not parse
    /// or is out of range.
    #[response(status = 400, content_type = "application/problem+json")]
    BadParameter(#[to_schema] ProblemBody),
    /// `/problems/unauthorized`: the token is missing, malformed, expired or forged.
    #[response(status = 401, content_type = "application/problem+json")]
    Unauthorized(#[to_schema] ProblemBody),
    /// `/problems/timeout`, `/problems/unavailable`: too slow, or the database pool is
    /// exhausted; nothing was written. Retry (a send with the same `clientMsgId`).
    #[response(status = 503, content_type = "application/problem+json")]
    Unavailable(#[to_schema] ProblemBody),
    /// `/problems/internal`: a bug or a database failure; nothing was committed.
    #[response(status = 500, content_type = "application/problem+json")]
    Internal(#[to_schema] ProblemBody),
}

/// What a call on one conversation can answer besides [`Common`].
#[derive(IntoResponses)]
#[allow(dead_code)]
pub enum Scoped {
    /// `/problems/not-found`: no such conversation, or the caller is not a member of it
    /// (the same answer, so a stranger learns nothing); or no such message or member.
    #[response(status = 404, content_type = "application/problem+json")]
    NotFound(#[to_schema] ProblemBody),
}

/// What a call with a JSON body can answer besides [`Common`].
#[derive(IntoResponses)]
#[allow(dead_code)]
pub enum WithBody {
    /// `/problems/malformed-json`: the body is not JSON (also `invalid-parameter` for a
    /// bad path or query value).
    #[response(status = 400, content_type = "application/problem+json")]
    Malformed(#[to_schema] ProblemBody),
    /// `/problems/body-too-large`: over `http.max_request_bytes`.
    #[response(status = 413, content_type = "application/problem+json")]
    TooLarge(#[to_schema] ProblemBody),
    /// `/problems/unsupported-media-type`: no `Content-Type: application/json`.
    #[response(status = 415, content_type = "application/problem+json")]
    MediaType(#[to_schema] ProblemBody),
    /// `/problems/invalid-field`: a missing field, a value of the wrong type or out of
    /// range, an unknown field; `field` names it.
    #[response(status = 422, content_type = "application/problem+json")]
    Invalid(#[to_schema] ProblemBody),
}

/// A write that counts against the caller's rate limit.
#[derive(IntoResponses)]
#[allow(dead_code)]
pub enum Limited {
    /// `/problems/rate-limited`: over the caller's rate limit; `Retry-After` says when
    /// to try again, in whole seconds.
    #[response(
        status = 429,
        content_type = "application/problem+json",
        headers(("Retry-After" = u64, description = "seconds to wait"))
    )]
    RateLimited(#[to_schema] ProblemBody),
}

/// `{"status": ...}` of the operations routes.
#[derive(serde::Serialize, ToSchema)]
pub struct Status {
    /// `ok` (`/healthz`) or `ready` (`/readyz`).
    pub status: &'static str,
}

/// The `Idempotency-Key` header of the creating routes (`POST /v1/conversations`, `POST
/// /v1/direct`).
#[derive(utoipa::IntoParams)]
#[into_params(names("Idempotency-Key"), parameter_in = Header)]
#[allow(dead_code)]
pub struct IdempotencyKeyHeader(
    /// A key the client makes for each create and keeps for its retries (a UUID, say; 1
    /// to `limits.max_idempotency_key_chars` visible ASCII characters, bare or quoted). A
    /// retry with the same key and the same request within
    /// `limits.idempotency_key_retention_s` (24 h) gets the first answer again, with
    /// `Idempotent-Replayed: true`, and makes nothing; the same key with another request
    /// is 409 `/problems/idempotency-key-reused`; a malformed key is 400
    /// `/problems/invalid-parameter`.
    Option<String>,
);
