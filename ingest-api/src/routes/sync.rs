use axum::extract::State;
use axum::response::IntoResponse;
use serde::Deserialize;

use crate::domain::page_limit;
use crate::error::ApiError;
use crate::extract::{Caller, Query};
use crate::rate::Kind;
use crate::state::AppState;
use crate::store::sync as store;

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct SyncQuery {
    since: Option<String>,
    limit: Option<i64>,
}

/// `GET /sync?since=&limit=`: every conversation of the caller that changed since the
/// cursor, with up to `limit` new or changed messages each; without `since`, the whole
/// inbox state and a first cursor. In bounded answers: `hasMore` says to call again with
/// `nextCursor` at once.
#[utoipa::path(
    get,
    path = "/sync",
    tag = "inbox",
    summary = "Everything that changed since a cursor, in one call",
    params(SyncQuery),
    responses(
        (status = 200, description = "The changed conversations and a new cursor", body = crate::store::sync::SyncPage),
        (status = 409, description = "`/problems/cursor-stale`: the cursor is of another history of the database (a failover, a restore, another deployment), or older than the hot window with changes since then archived; sync again without `since`", body = crate::openapi::ProblemBody, content_type = "application/problem+json"),
        crate::openapi::Common
    )
)]
pub async fn sync(
    State(state): State<AppState>,
    Caller(user): Caller,
    Query(q): Query<SyncQuery>,
) -> Result<impl IntoResponse, ApiError> {
    state.rate.check(Kind::Read, user)?;
    let limit = page_limit(q.limit, &state.limits)?;
    let since = q
        .since
        .as_deref()
        .map(|raw| {
            state.cursors.open(user, raw).ok_or_else(|| {
                ApiError::bad_parameter("since", "is not a cursor this API handed out to you")
            })
        })
        .transpose()?;
    Ok(axum::Json(
        store::sync(
            &state.store,
            &state.cursors,
            user,
            since.as_ref(),
            limit,
            state.sync_bounds,
        )
        .await?,
    ))
}
