use axum::extract::State;
use axum::response::IntoResponse;
use chatpipe_core::{ConversationId, Seq};
use serde::Deserialize;

use crate::domain::seq;
use crate::error::ApiError;
use crate::extract::{Caller, ConversationPath, Json, PathParams};
use crate::startup::AppState;
use crate::store::reads as store;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MarkRead {
    seq: i64,
}

/// `POST /conversations/{id}/read` `{seq}` → `{lastReadSeq, advanced}`.
pub async fn mark_read(
    State(state): State<AppState>,
    Caller(reader): Caller,
    ConversationPath(conversation): ConversationPath,
    Json(req): Json<MarkRead>,
) -> Result<impl IntoResponse, ApiError> {
    let seq = seq("seq", req.seq)?;
    Ok(axum::Json(
        store::mark_read(&state.store, conversation, reader, seq).await?,
    ))
}

/// `GET /conversations/{id}/messages/{seq}/receipts`
pub async fn receipts(
    State(state): State<AppState>,
    Caller(caller): Caller,
    path: PathParams,
) -> Result<impl IntoResponse, ApiError> {
    let conversation: ConversationId = path.get("id")?;
    let seq: Seq = path.get("seq")?;
    Ok(axum::Json(
        store::receipts(&state.store, conversation, caller, seq).await?,
    ))
}
