use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use chatpipe_core::{ConversationId, UserId};
use chatpipe_schemas::Role;
use serde::Deserialize;
use std::time::Duration;

use crate::domain::{parse_title, user_ids, ConversationKind};
use crate::error::ApiError;
use crate::extract::{Caller, ConversationPath, IdempotencyKey, Json, PathParams};
use crate::rate::Kind;
use crate::state::AppState;
use crate::store::conversations as store;
use crate::store::idempotency::{Answer, Keyed, Outcome};

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CreateConversation {
    #[serde(rename = "type")]
    kind: String,
    title: Option<String>,
    member_ids: Vec<i64>,
}

/// `POST /conversations`: a new GROUP; the caller becomes a member.
#[utoipa::path(
    post,
    path = "/conversations",
    tag = "conversations",
    summary = "Create a group; the caller becomes its admin",
    request_body = CreateConversation,
    params(crate::openapi::IdempotencyKeyHeader),
    responses(
        (status = 201, description = "The group; with an `Idempotency-Key` seen before (same request, within `limits.idempotency_key_retention_s`), the first answer again, with `Idempotent-Replayed: true`", body = crate::store::conversations::ConversationView),
        (status = 403, description = "`/problems/blocked`: a named user blocked the caller; nobody was added", body = crate::openapi::ProblemBody, content_type = "application/problem+json"),
        (status = 409, description = "`/problems/member-limit`: more than `limits.max_group_members`; `/problems/idempotency-key-reused`: the `Idempotency-Key` named another request", body = crate::openapi::ProblemBody, content_type = "application/problem+json"),
        crate::openapi::Common,
        crate::openapi::WithBody,
        crate::openapi::Limited
    )
)]
pub async fn create(
    State(state): State<AppState>,
    Caller(caller): Caller,
    IdempotencyKey(key): IdempotencyKey,
    Json(req): Json<CreateConversation>,
) -> Result<Response, ApiError> {
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
    let strangers = members.iter().filter(|&&m| m != caller.get()).count();
    state
        .rate
        .check_n(Kind::MembersAdded, caller, strangers, "memberIds")?;
    let key = key.map(|key| Keyed {
        user: caller,
        request: serde_json::json!({"op": "createGroup", "title": title, "memberIds": members}),
        key,
        retention: Duration::from_secs(limits.idempotency_key_retention_s),
    });
    let outcome = store::create_group(
        &state.store,
        caller,
        title,
        members,
        limits.max_group_members,
        key.as_ref(),
    )
    .await?;
    Ok(match outcome {
        Outcome::Done(view) => (StatusCode::CREATED, axum::Json(view)).into_response(),
        Outcome::Replayed(first) => replayed(first),
    })
}

/// The first answer to an `Idempotency-Key`, given again.
fn replayed(first: Answer) -> Response {
    let status = StatusCode::from_u16(first.status).unwrap_or(StatusCode::OK);
    let mut response = (status, axum::Json(first.body)).into_response();
    response.headers_mut().insert(
        "idempotent-replayed",
        axum::http::HeaderValue::from_static("true"),
    );
    response
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct OpenDirect {
    peer_id: i64,
}

/// `POST /direct`: the one DIRECT conversation of the caller and `peerId`.
#[utoipa::path(
    post,
    path = "/direct",
    tag = "conversations",
    summary = "The one DIRECT conversation of the caller and a peer",
    request_body = OpenDirect,
    params(crate::openapi::IdempotencyKeyHeader),
    responses(
        (status = 201, description = "Opened now; with an `Idempotency-Key` of the request that opened it, the first answer again, with `Idempotent-Replayed: true`", body = crate::store::conversations::ConversationView),
        (status = 200, description = "It existed: the same conversation (a caller who had left it is a member again)", body = crate::store::conversations::ConversationView),
        (status = 403, description = "`/problems/blocked`: the peer blocked the caller", body = crate::openapi::ProblemBody, content_type = "application/problem+json"),
        crate::openapi::Common,
        crate::openapi::WithBody,
        crate::openapi::Limited
    )
)]
pub async fn open_direct(
    State(state): State<AppState>,
    Caller(caller): Caller,
    IdempotencyKey(key): IdempotencyKey,
    Json(req): Json<OpenDirect>,
) -> Result<Response, ApiError> {
    state.rate.check(Kind::Create, caller)?;
    let peer = UserId::new(req.peer_id).map_err(|e| ApiError::invalid("peerId", e.to_string()))?;
    if peer == caller {
        return Err(ApiError::invalid(
            "peerId",
            "must be another user than the caller",
        ));
    }
    let key = key.map(|key| Keyed {
        user: caller,
        request: serde_json::json!({"op": "openDirect", "peerId": peer.get()}),
        key,
        retention: Duration::from_secs(state.limits.idempotency_key_retention_s),
    });
    let (view, created) = match store::open_direct(&state.store, caller, peer, key.as_ref()).await?
    {
        Outcome::Done(done) => done,
        Outcome::Replayed(first) => return Ok(replayed(first)),
    };
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, axum::Json(view)).into_response())
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AddMembers {
    user_ids: Vec<i64>,
}

/// `POST /conversations/{id}/members`
#[utoipa::path(
    post,
    path = "/conversations/{id}/members",
    tag = "conversations",
    summary = "Add members to a group (admins only)",
    params(("id" = i64, Path, description = "the conversation", minimum = 1)),
    request_body = AddMembers,
    responses(
        (status = 200, description = "Who was added", body = crate::store::conversations::MembersAdded),
        (status = 403, description = "`/problems/forbidden`: the caller is not an admin of the group; `/problems/blocked`: a named user blocked the caller, nobody was added", body = crate::openapi::ProblemBody, content_type = "application/problem+json"),
        (status = 409, description = "`/problems/member-limit`, `/problems/direct-membership-fixed`", body = crate::openapi::ProblemBody, content_type = "application/problem+json"),
        crate::openapi::Common,
        crate::openapi::Scoped,
        crate::openapi::WithBody,
        crate::openapi::Limited
    )
)]
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
    state
        .rate
        .check_n(Kind::MembersAdded, caller, ids.len(), "userIds")?;
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
#[utoipa::path(
    delete,
    path = "/conversations/{id}/members/{userId}",
    tag = "conversations",
    summary = "Leave (a DIRECT conversation too: for good, until you open it again), or remove a member (admins only)",
    params(("id" = i64, Path, description = "the conversation", minimum = 1), ("userId" = i64, Path, description = "the member", minimum = 1)),
    responses(
        (status = 204, description = "Gone (also when already gone)"),
        (status = 403, description = "`/problems/forbidden`: removing another member without being an admin", body = crate::openapi::ProblemBody, content_type = "application/problem+json"),
        (status = 409, description = "`/problems/direct-membership-fixed`: removing the other member of a DIRECT conversation", body = crate::openapi::ProblemBody, content_type = "application/problem+json"),
        crate::openapi::Common,
        crate::openapi::Scoped,
        crate::openapi::Limited
    )
)]
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
#[utoipa::path(
    get,
    path = "/conversations/{id}/members",
    tag = "conversations",
    summary = "Who is in it, longest-standing first",
    params(("id" = i64, Path, description = "the conversation", minimum = 1)),
    responses(
        (status = 200, description = "The members with their roles", body = MembersList),
        crate::openapi::Common,
        crate::openapi::Scoped
    )
)]
pub async fn members(
    State(state): State<AppState>,
    Caller(caller): Caller,
    ConversationPath(conversation): ConversationPath,
) -> Result<impl IntoResponse, ApiError> {
    state.rate.check(Kind::Read, caller)?;
    let members = store::members(&state.store, conversation, caller).await?;
    Ok(axum::Json(MembersList {
        conversation_id: conversation,
        members,
    }))
}

/// The answer of `GET /conversations/{id}/members`.
#[derive(serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct MembersList {
    conversation_id: ConversationId,
    members: Vec<store::MemberEntry>,
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SetRole {
    role: String,
}

/// `PATCH /conversations/{id}/members/{userId}` `{role}`: an admin makes a member admin
/// (`"ADMIN"`) or an admin a member (`"MEMBER"`).
#[utoipa::path(
    patch,
    path = "/conversations/{id}/members/{userId}",
    tag = "conversations",
    summary = "Make a member an admin, or an admin a member (admins only)",
    params(("id" = i64, Path, description = "the conversation", minimum = 1), ("userId" = i64, Path, description = "the member", minimum = 1)),
    request_body = SetRole,
    responses(
        (status = 200, description = "The role now", body = crate::store::conversations::RoleSet),
        (status = 403, description = "`/problems/forbidden`", body = crate::openapi::ProblemBody, content_type = "application/problem+json"),
        (status = 409, description = "`/problems/last-admin`, `/problems/direct-membership-fixed`", body = crate::openapi::ProblemBody, content_type = "application/problem+json"),
        crate::openapi::Common,
        crate::openapi::Scoped,
        crate::openapi::WithBody,
        crate::openapi::Limited
    )
)]
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
