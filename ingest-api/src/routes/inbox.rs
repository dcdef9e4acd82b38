use axum::extract::State;
use axum::response::IntoResponse;
use serde::Deserialize;

use crate::domain::page_limit;
use crate::error::ApiError;
use crate::extract::{Caller, Query};
use crate::state::AppState;
use crate::store::inbox::{self as store, Cursor};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InboxQuery {
    limit: Option<i64>,
    cursor: Option<String>,
}

/// `GET /inbox?limit=&cursor=`
pub async fn inbox(
    State(state): State<AppState>,
    Caller(user): Caller,
    Query(q): Query<InboxQuery>,
) -> Result<impl IntoResponse, ApiError> {
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
