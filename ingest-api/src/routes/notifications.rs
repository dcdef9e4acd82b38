use axum::extract::State;
use axum::response::IntoResponse;
use chrono::{DateTime, Utc};
use serde::Deserialize;

use crate::error::ApiError;
use crate::extract::{Caller, ConversationPath, Json};
use crate::rate::Kind;
use crate::state::AppState;
use crate::store::notifications::{self as store, Level};

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SetNotifications {
    /// `all` (every message), `mentions` (only messages that name the caller), `none`.
    level: Level,
    /// Nothing at all until then (RFC 3339); absent or null: not muted.
    muted_until: Option<DateTime<Utc>>,
}

/// `PUT /conversations/{id}/notifications` `{level, mutedUntil?}`
#[utoipa::path(
    put,
    path = "/conversations/{id}/notifications",
    tag = "conversations",
    summary = "What the caller hears about from this conversation while offline",
    params(("id" = i64, Path, description = "the conversation", minimum = 1)),
    request_body = SetNotifications,
    responses(
        (status = 200, description = "The caller's setting now", body = store::Setting),
        crate::openapi::Common,
        crate::openapi::Scoped,
        crate::openapi::WithBody,
        crate::openapi::Limited
    )
)]
pub async fn set(
    State(state): State<AppState>,
    Caller(caller): Caller,
    ConversationPath(conversation): ConversationPath,
    Json(req): Json<SetNotifications>,
) -> Result<impl IntoResponse, ApiError> {
    state.rate.check(Kind::MemberChange, caller)?;
    let setting = store::set(
        &state.store,
        conversation,
        caller,
        req.level,
        req.muted_until,
    )
    .await?;
    Ok(axum::Json(setting))
}
