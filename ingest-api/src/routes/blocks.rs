//! `/blocks`: whom the caller blocked (store/blocks.rs says what a block does).

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use chatpipe_core::UserId;

use crate::error::ApiError;
use crate::extract::{Caller, PathParams};
use crate::rate::Kind;
use crate::state::AppState;
use crate::store::blocks as store;

/// `POST /blocks/{userId}`
#[utoipa::path(
    post,
    path = "/blocks/{userId}",
    tag = "blocks",
    summary = "Block a user: no messages either way in your DIRECT, no invitations from them",
    params(("userId" = i64, Path, description = "the user to block", minimum = 1)),
    responses(
        (status = 204, description = "Blocked (also when already blocked)"),
        crate::openapi::Common,
        crate::openapi::Limited
    )
)]
pub async fn block(
    State(state): State<AppState>,
    Caller(caller): Caller,
    path: PathParams,
) -> Result<StatusCode, ApiError> {
    state.rate.check(Kind::MemberChange, caller)?;
    let user: UserId = path.get("userId")?;
    if user == caller {
        return Err(ApiError::bad_parameter(
            "userId",
            "a user cannot block themselves",
        ));
    }
    store::block(&state.store, caller, user).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `DELETE /blocks/{userId}`
#[utoipa::path(
    delete,
    path = "/blocks/{userId}",
    tag = "blocks",
    summary = "Lift a block",
    params(("userId" = i64, Path, description = "the blocked user", minimum = 1)),
    responses(
        (status = 204, description = "Not blocked (also when it was not)"),
        crate::openapi::Common,
        crate::openapi::Limited
    )
)]
pub async fn unblock(
    State(state): State<AppState>,
    Caller(caller): Caller,
    path: PathParams,
) -> Result<StatusCode, ApiError> {
    state.rate.check(Kind::MemberChange, caller)?;
    let user: UserId = path.get("userId")?;
    store::unblock(&state.store, caller, user).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The answer of `GET /blocks`.
#[derive(serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct BlockList {
    blocked: Vec<store::BlockEntry>,
}

/// `GET /blocks`
#[utoipa::path(
    get,
    path = "/blocks",
    tag = "blocks",
    summary = "Whom the caller blocked, the latest first",
    responses(
        (status = 200, description = "The blocked users", body = BlockList),
        crate::openapi::Common,
        crate::openapi::Limited
    )
)]
pub async fn list(
    State(state): State<AppState>,
    Caller(caller): Caller,
) -> Result<impl IntoResponse, ApiError> {
    state.rate.check(Kind::Read, caller)?;
    let blocked = store::list(&state.store, caller).await?;
    Ok(axum::Json(BlockList { blocked }))
}
