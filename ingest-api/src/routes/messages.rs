use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use chatpipe_core::{ConversationId, Seq};
use serde::Deserialize;
use uuid::Uuid;

use crate::domain::{page_limit, MessageBody};
use crate::error::ApiError;
use crate::extract::{Caller, ConversationPath, Json, PathParams, Query};
use crate::rate::Kind;
use crate::state::AppState;
use crate::store::history::Page;
use crate::store::messages as store;
use crate::store::send::SendOutcome;

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SendMessage {
    client_msg_id: Uuid,
    body: String,
}

/// `POST /conversations/{id}/messages`: 201 for a new message, 200 for a replay.
#[utoipa::path(
    post,
    path = "/conversations/{id}/messages",
    tag = "messages",
    summary = "Send a message (idempotent on clientMsgId)",
    params(("id" = i64, Path, description = "the conversation", minimum = 1)),
    request_body = SendMessage,
    responses(
        (status = 201, description = "Committed: its seq", body = crate::store::send::SentMessage),
        (status = 200, description = "A retry of a committed send: the original seq", body = crate::store::send::SentMessage),
        (status = 403, description = "`/problems/blocked`: a DIRECT conversation with a block either way", body = crate::openapi::ProblemBody, content_type = "application/problem+json"),
        (status = 409, description = "`/problems/client-msg-id-reused`: the clientMsgId names a different message", body = crate::openapi::ProblemBody, content_type = "application/problem+json"),
        crate::openapi::Common,
        crate::openapi::Scoped,
        crate::openapi::WithBody,
        crate::openapi::Limited
    )
)]
pub async fn send(
    State(state): State<AppState>,
    Caller(sender): Caller,
    ConversationPath(conversation): ConversationPath,
    Json(req): Json<SendMessage>,
) -> Result<impl IntoResponse, ApiError> {
    state.rate.check(Kind::Send, sender)?;
    let body = MessageBody::parse(req.body, &state.limits)?;
    Ok(
        match state
            .sends
            .send(conversation, sender, req.client_msg_id, &body)
            .await?
        {
            SendOutcome::Created(sent) => (StatusCode::CREATED, axum::Json(sent)),
            SendOutcome::Replayed(sent) => (StatusCode::OK, axum::Json(sent)),
        },
    )
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HistoryQuery {
    before_seq: Option<i64>,
    after_seq: Option<i64>,
    limit: Option<i64>,
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct EditMessage {
    body: String,
}

/// `PATCH /conversations/{id}/messages/{seq}` `{body}`: the sender replaces the body.
#[utoipa::path(
    patch,
    path = "/conversations/{id}/messages/{seq}",
    tag = "messages",
    summary = "Replace a message's body (its sender only)",
    params(("id" = i64, Path, description = "the conversation", minimum = 1), ("seq" = i64, Path, description = "the message", minimum = 1)),
    request_body = EditMessage,
    responses(
        (status = 200, description = "The message as it is now", body = crate::store::messages::Edited),
        (status = 403, description = "`/problems/forbidden`: not the sender; `/problems/blocked`: a DIRECT conversation with a block either way", body = crate::openapi::ProblemBody, content_type = "application/problem+json"),
        (status = 409, description = "`/problems/message-deleted`", body = crate::openapi::ProblemBody, content_type = "application/problem+json"),
        crate::openapi::Common,
        crate::openapi::Scoped,
        crate::openapi::WithBody,
        crate::openapi::Limited
    )
)]
pub async fn edit(
    State(state): State<AppState>,
    Caller(caller): Caller,
    path: PathParams,
    Json(req): Json<EditMessage>,
) -> Result<impl IntoResponse, ApiError> {
    state.rate.check(Kind::Send, caller)?;
    let conversation: ConversationId = path.get("id")?;
    let seq: Seq = path.get("seq")?;
    let body = MessageBody::parse(req.body, &state.limits)?;
    let edited = store::edit(&state.store, conversation, caller, seq, body.as_str()).await?;
    Ok(axum::Json(edited))
}

/// `DELETE /conversations/{id}/messages/{seq}`: the sender, or an admin of the group,
/// erases the body. 204, and 204 again when repeated.
#[utoipa::path(
    delete,
    path = "/conversations/{id}/messages/{seq}",
    tag = "messages",
    summary = "Delete a message: its body is erased (the sender, or an admin of the group)",
    params(("id" = i64, Path, description = "the conversation", minimum = 1), ("seq" = i64, Path, description = "the message", minimum = 1)),
    responses(
        (status = 204, description = "Deleted (also when already deleted)"),
        (status = 403, description = "`/problems/forbidden`", body = crate::openapi::ProblemBody, content_type = "application/problem+json"),
        crate::openapi::Common,
        crate::openapi::Scoped,
        crate::openapi::Limited
    )
)]
pub async fn delete(
    State(state): State<AppState>,
    Caller(caller): Caller,
    path: PathParams,
) -> Result<impl IntoResponse, ApiError> {
    state.rate.check(Kind::Send, caller)?;
    let conversation: ConversationId = path.get("id")?;
    let seq: Seq = path.get("seq")?;
    store::delete(&state.store, conversation, caller, seq).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /conversations/{id}/messages?beforeSeq=&afterSeq=&limit=`
#[utoipa::path(
    get,
    path = "/conversations/{id}/messages",
    tag = "messages",
    summary = "Page history (newest page, or before/after a seq)",
    params(("id" = i64, Path, description = "the conversation", minimum = 1), HistoryQuery),
    responses(
        (status = 200, description = "Messages in ascending seq", body = crate::store::history::HistoryPage),
        crate::openapi::Common,
        crate::openapi::Scoped
    )
)]
pub async fn history(
    State(state): State<AppState>,
    Caller(reader): Caller,
    ConversationPath(conversation): ConversationPath,
    Query(q): Query<HistoryQuery>,
) -> Result<impl IntoResponse, ApiError> {
    state.rate.check(Kind::Read, reader)?;
    let limit = page_limit(q.limit, &state.limits)?;
    let page = match (q.before_seq, q.after_seq) {
        (Some(_), Some(_)) => {
            return Err(ApiError::bad_parameter(
                "afterSeq",
                "give beforeSeq or afterSeq, not both",
            ));
        }
        (Some(before), None) if before < 1 => {
            return Err(ApiError::bad_parameter(
                "beforeSeq",
                format!("must be a positive seq, got {before}"),
            ));
        }
        (None, Some(after)) if after < 0 => {
            return Err(ApiError::bad_parameter(
                "afterSeq",
                format!("must be 0 or a positive seq, got {after}"),
            ));
        }
        (Some(before), None) => Page::Before(before),
        (None, Some(after)) => Page::After(after),
        (None, None) => Page::Newest,
    };
    Ok(axum::Json(
        crate::store::history::history(&state.store, conversation, reader, page, limit).await?,
    ))
}
