//! A member's place in a thread: follow, unfollow, read (store/threads.rs).

use axum::extract::State;
use axum::response::IntoResponse;
use chatpipe_core::{ConversationId, Seq};
use serde::Deserialize;

use crate::error::ApiError;
use crate::extract::{Caller, Json, PathParams};
use crate::rate::Kind;
use crate::state::AppState;
use crate::store::threads::{self as store, ThreadPosition};

/// `PUT /conversations/{id}/threads/{rootSeq}/follow`
#[utoipa::path(
    put,
    path = "/conversations/{id}/threads/{rootSeq}/follow",
    tag = "messages",
    summary = "Follow a thread: its unread replies count in the caller's unreadThreads (idempotent)",
    params(("id" = i64, Path, description = "the conversation", minimum = 1),
           ("rootSeq" = i64, Path, description = "the thread's root: a top-level message", minimum = 1)),
    responses(
        (status = 200, description = "The caller's place in the thread", body = ThreadPosition),
        crate::openapi::Common,
        crate::openapi::Scoped,
        crate::openapi::Limited
    )
)]
pub async fn follow(
    State(state): State<AppState>,
    Caller(caller): Caller,
    path: PathParams,
) -> Result<impl IntoResponse, ApiError> {
    position(state, caller, path, (None, Some(true))).await
}

/// `DELETE /conversations/{id}/threads/{rootSeq}/follow`
#[utoipa::path(
    delete,
    path = "/conversations/{id}/threads/{rootSeq}/follow",
    tag = "messages",
    summary = "Stop following a thread; the read position stays (idempotent)",
    params(("id" = i64, Path, description = "the conversation", minimum = 1),
           ("rootSeq" = i64, Path, description = "the thread's root", minimum = 1)),
    responses(
        (status = 200, description = "The caller's place in the thread", body = ThreadPosition),
        crate::openapi::Common,
        crate::openapi::Scoped,
        crate::openapi::Limited
    )
)]
pub async fn unfollow(
    State(state): State<AppState>,
    Caller(caller): Caller,
    path: PathParams,
) -> Result<impl IntoResponse, ApiError> {
    position(state, caller, path, (None, Some(false))).await
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReadThread {
    /// Every reply up to this seq is read; past the thread's newest reply it stops there.
    seq: i64,
}

/// `POST /conversations/{id}/threads/{rootSeq}/read` `{seq}`
#[utoipa::path(
    post,
    path = "/conversations/{id}/threads/{rootSeq}/read",
    tag = "reads",
    summary = "Mark a thread read up to a seq (monotone, like the conversation's watermark)",
    params(("id" = i64, Path, description = "the conversation", minimum = 1),
           ("rootSeq" = i64, Path, description = "the thread's root", minimum = 1)),
    request_body = ReadThread,
    responses(
        (status = 200, description = "The caller's place in the thread", body = ThreadPosition),
        crate::openapi::Common,
        crate::openapi::Scoped,
        crate::openapi::WithBody,
        crate::openapi::Limited
    )
)]
pub async fn read(
    State(state): State<AppState>,
    Caller(caller): Caller,
    path: PathParams,
    Json(req): Json<ReadThread>,
) -> Result<impl IntoResponse, ApiError> {
    let seq = crate::domain::seq("seq", req.seq)?;
    position(state, caller, path, (Some(seq.get()), None)).await
}

async fn position(
    state: AppState,
    caller: chatpipe_core::UserId,
    path: PathParams,
    change: (Option<i64>, Option<bool>),
) -> Result<axum::Json<ThreadPosition>, ApiError> {
    state.rate.check(Kind::Read, caller)?;
    let conversation: ConversationId = path.get("id")?;
    let root: Seq = path.get("rootSeq")?;
    let position = store::set_position(&state.store, conversation, caller, root, change).await?;
    Ok(axum::Json(position))
}
