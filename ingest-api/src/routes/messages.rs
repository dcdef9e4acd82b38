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
use crate::store::messages::{self as store, Page};
use crate::store::send::SendOutcome;

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SendMessage {
    client_msg_id: Uuid,
    body: String,
}

/// `POST /conversations/{id}/messages`: 201 for a new message, 200 for a replay.
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

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HistoryQuery {
    before_seq: Option<i64>,
    after_seq: Option<i64>,
    limit: Option<i64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct EditMessage {
    body: String,
}

/// `PATCH /conversations/{id}/messages/{seq}` `{body}`: the sender replaces the body.
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
pub async fn history(
    State(state): State<AppState>,
    Caller(reader): Caller,
    ConversationPath(conversation): ConversationPath,
    Query(q): Query<HistoryQuery>,
) -> Result<impl IntoResponse, ApiError> {
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
        store::history(&state.store, conversation, reader, page, limit).await?,
    ))
}
