use axum::extract::State;
use axum::response::IntoResponse;
use serde::Deserialize;

use crate::domain::page_limit;
use crate::error::ApiError;
use crate::extract::{Caller, Query};
use crate::rate::Kind;
use crate::state::AppState;
use crate::store::inbox::{self as store, Cursor};

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct InboxQuery {
    limit: Option<i64>,
    cursor: Option<String>,
}

/// `GET /inbox?limit=&cursor=`
#[utoipa::path(
    get,
    path = "/inbox",
    tag = "inbox",
    summary = "The caller's conversations, most recent activity first, with unread counts",
    params(InboxQuery),
    responses(
        (status = 200, description = "A page of the inbox", body = crate::store::inbox::InboxPage),
        crate::openapi::Common
    )
)]
pub async fn inbox(
    State(state): State<AppState>,
    Caller(user): Caller,
    Query(q): Query<InboxQuery>,
) -> Result<impl IntoResponse, ApiError> {
    state.rate.check(Kind::Read, user)?;
    let limit = page_limit(q.limit, &state.limits)?;
    let cursor = q
        .cursor
        .as_deref()
        .map(|raw| {
            Cursor::decode(raw).ok_or_else(|| {
                ApiError::bad_parameter("cursor", "is not a cursor this API returned")
            })
        })
        .transpose()?;
    Ok(axum::Json(
        store::inbox(
            &state.store,
            user,
            cursor,
            limit,
            state.limits.preview_chars,
        )
        .await?,
    ))
}
