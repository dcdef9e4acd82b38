use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use chatpipe_core::{ConversationId, UserId};
use chatpipe_schemas::Role;
use serde::Deserialize;

use crate::domain::{parse_title, user_ids, ConversationKind};
use crate::error::ApiError;
use crate::extract::{Caller, ConversationPath, Json, PathParams};
use crate::rate::Kind;
use crate::state::AppState;
use crate::store::conversations as store;

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CreateConversation {
    #[serde(rename = "type")]
    kind: String,
    title: Option<String>,
    member_ids: Vec<i64>,
}

/// `POST /conversations`: a new GROUP; the caller becomes a member.
pub async fn create(
    State(state): State<AppState>,
    Caller(caller): Caller,
    Json(req): Json<CreateConversation>,
) -> Result<impl IntoResponse, ApiError> {
    state.rate.check(Kind::Create, caller)?;
    if req.kind.parse() != Ok(ConversationKind::Group) {
        return Err(ApiError::invalid(
            "type",
            "must be \"GROUP\"; open a DIRECT conversation with POST /direct",
        ));
    }
    let limits = &state.limits;
    let title = parse_title(req.title, limits)?;
    let members = user_ids("memberIds", req.member_ids, limits.max_group_members)?;
    let view = store::create_group(
        &state.store,
        caller,
        title,
        members,
        limits.max_group_members,
    )
    .await?;
    Ok((StatusCode::CREATED, axum::Json(view)))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct OpenDirect {
    peer_id: i64,
}

/// `POST /direct`: the one DIRECT conversation of the caller and `peerId`.
pub async fn open_direct(
    State(state): State<AppState>,
    Caller(caller): Caller,
    Json(req): Json<OpenDirect>,
) -> Result<impl IntoResponse, ApiError> {
    state.rate.check(Kind::Create, caller)?;
    let peer = UserId::new(req.peer_id).map_err(|e| ApiError::invalid("peerId", e.to_string()))?;
    if peer == caller {
        return Err(ApiError::invalid(
            "peerId",
            "must be another user than the caller",
        ));
    }
    let (view, created) = store::open_direct(&state.store, caller, peer).await?;
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, axum::Json(view)))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct AddMembers {
    user_ids: Vec<i64>,
}

/// `POST /conversations/{id}/members`
pub async fn add_members(
    State(state): State<AppState>,
    Caller(caller): Caller,
    ConversationPath(conversation): ConversationPath,
    Json(req): Json<AddMembers>,
) -> Result<impl IntoResponse, ApiError> {
    state.rate.check(Kind::MemberChange, caller)?;
    let limits = &state.limits;
    let ids = user_ids("userIds", req.user_ids, limits.max_group_members)?;
    if ids.is_empty() {
        return Err(ApiError::invalid("userIds", "must name at least one user"));
    }
    let added = store::add_members(
        &state.store,
        conversation,
        caller,
        &ids,
        limits.max_group_members,
    )
    .await?;
    Ok(axum::Json(added))
}

/// `DELETE /conversations/{id}/members/{userId}`
pub async fn remove_member(
    State(state): State<AppState>,
    Caller(caller): Caller,
    path: PathParams,
) -> Result<StatusCode, ApiError> {
    state.rate.check(Kind::MemberChange, caller)?;
    let conversation: ConversationId = path.get("id")?;
    let user: UserId = path.get("userId")?;
    store::remove_member(&state.store, conversation, caller, user).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /conversations/{id}/members`: who is in it, with their roles, longest-standing
/// first.
pub async fn members(
    State(state): State<AppState>,
    Caller(caller): Caller,
    ConversationPath(conversation): ConversationPath,
) -> Result<impl IntoResponse, ApiError> {
    let members = store::members(&state.store, conversation, caller).await?;
    Ok(axum::Json(serde_json::json!({
        "conversationId": conversation,
        "members": members,
    })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SetRole {
    role: String,
}

/// `PATCH /conversations/{id}/members/{userId}` `{role}`: an admin makes a member admin
/// (`"ADMIN"`) or an admin a member (`"MEMBER"`).
pub async fn set_role(
    State(state): State<AppState>,
    Caller(caller): Caller,
    path: PathParams,
    Json(req): Json<SetRole>,
) -> Result<impl IntoResponse, ApiError> {
    state.rate.check(Kind::MemberChange, caller)?;
    let conversation: ConversationId = path.get("id")?;
    let user: UserId = path.get("userId")?;
    let role: Role = req
        .role
        .parse()
        .map_err(|detail: String| ApiError::invalid("role", detail))?;
    let set = store::set_role(&state.store, conversation, caller, user, role).await?;
    Ok(axum::Json(set))
}
