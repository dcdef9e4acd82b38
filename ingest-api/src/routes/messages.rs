use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use chatpipe_core::{ConversationId, Seq};
use serde::Deserialize;
use uuid::Uuid;

use crate::domain::{page_limit, user_ids, MessageBody, ReactionKey};
use crate::error::ApiError;
use crate::extract::{Caller, ConversationPath, Json, PathParams, Query};
use crate::rate::Kind;
use crate::state::AppState;
use crate::store::history::Page;
use crate::store::mentions;
use crate::store::messages as store;
use crate::store::reactions::{self, Change};
use crate::store::send::{Outgoing, SendError, SendOutcome};
use crate::store::threads;

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SendMessage {
    client_msg_id: Uuid,
    body: String,
    /// Members the message names (@): at most `limits.max_mentions` (50), each a member
    /// of the conversation; naming oneself names nobody.
    #[serde(default)]
    mentions: Vec<i64>,
    /// Names every other member (`@all`): for the admins of a group of at most
    /// `limits.max_mention_all_members` (100).
    #[serde(default)]
    mention_all: bool,
    /// A reply: the seq of a top-level message of this conversation, not deleted (422
    /// naming `threadRootSeq` otherwise). The reply takes the next seq as any message.
    thread_root_seq: Option<i64>,
}

/// `POST /conversations/{id}/messages`: 201 for a new message, 200 for a replay.
#[utoipa::path(
    post,
    path = "/conversations/{id}/messages",
    tag = "messages",
    summary = "Send a message (idempotent on clientMsgId)",
    params(("id" = i64, Path, description = "the conversation", minimum = 1)),
    request_body = SendMessage,
    responses(
        (status = 201, description = "Committed: its seq", body = crate::store::send::SentMessage),
        (status = 200, description = "A retry of a committed send: the original seq", body = crate::store::send::SentMessage),
        (status = 403, description = "`/problems/blocked`: a DIRECT conversation with a block either way", body = crate::openapi::ProblemBody, content_type = "application/problem+json"),
        (status = 409, description = "`/problems/client-msg-id-reused`: the clientMsgId names a different message", body = crate::openapi::ProblemBody, content_type = "application/problem+json"),
        crate::openapi::Common,
        crate::openapi::Scoped,
        crate::openapi::WithBody,
        crate::openapi::Limited
    )
)]
pub async fn send(
    State(state): State<AppState>,
    Caller(sender): Caller,
    ConversationPath(conversation): ConversationPath,
    Json(req): Json<SendMessage>,
) -> Result<impl IntoResponse, ApiError> {
    state.rate.check(Kind::Send, sender)?;
    let body = MessageBody::parse(req.body, &state.limits)?;
    let mentions = named(
        &state,
        conversation,
        sender,
        (req.mentions, req.mention_all),
    )
    .await?;
    let thread_root = req
        .thread_root_seq
        .map(|root| crate::domain::seq("threadRootSeq", root))
        .transpose()?;
    let mut message = Outgoing {
        body: &body,
        mentions,
        thread_root,
        cold_root_author: None,
    };
    let sent = loop {
        match state
            .sends
            .send(conversation, sender, req.client_msg_id, message.clone())
            .await
        {
            // The root has left PostgreSQL: as the cold tier has it, then once more.
            Err(SendError::RootArchived { root }) if message.cold_root_author.is_none() => {
                match threads::check_cold_root(&state.store, conversation, root).await? {
                    Ok(author) => message.cold_root_author = Some(author),
                    Err(bad) => {
                        return Err(ApiError::invalid("threadRootSeq", bad.detail(root.get())))
                    }
                }
            }
            other => break other?,
        }
    };
    Ok(match sent {
        SendOutcome::Created(sent) => (StatusCode::CREATED, axum::Json(sent)),
        SendOutcome::Replayed(sent) => (StatusCode::OK, axum::Json(sent)),
    })
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HistoryQuery {
    before_seq: Option<i64>,
    after_seq: Option<i64>,
    limit: Option<i64>,
    /// A thread's replies instead of the conversation's messages: the root's seq (a
    /// reply, or a seq past the conversation's end: 400 naming it).
    thread_root_seq: Option<i64>,
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EditMessage {
    body: String,
    /// The members the message names from now on; absent (and no `mentionAll`): they
    /// stay as they are.
    mentions: Option<Vec<i64>>,
    /// Names every other member from now on, as for sends.
    #[serde(default)]
    mention_all: bool,
}

/// `PATCH /conversations/{id}/messages/{seq}` `{body}`: the sender replaces the body.
#[utoipa::path(
    patch,
    path = "/conversations/{id}/messages/{seq}",
    tag = "messages",
    summary = "Replace a message's body (its sender only)",
    params(("id" = i64, Path, description = "the conversation", minimum = 1), ("seq" = i64, Path, description = "the message", minimum = 1)),
    request_body = EditMessage,
    responses(
        (status = 200, description = "The message as it is now", body = crate::store::messages::Edited),
        (status = 403, description = "`/problems/forbidden`: not the sender; `/problems/blocked`: a DIRECT conversation with a block either way", body = crate::openapi::ProblemBody, content_type = "application/problem+json"),
        (status = 409, description = "`/problems/message-deleted`", body = crate::openapi::ProblemBody, content_type = "application/problem+json"),
        crate::openapi::Common,
        crate::openapi::Scoped,
        crate::openapi::WithBody,
        crate::openapi::Limited
    )
)]
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
    let mentions = match (req.mentions, req.mention_all) {
        (None, false) => None,
        (raw, all) => {
            Some(named(&state, conversation, caller, (raw.unwrap_or_default(), all)).await?)
        }
    };
    let change = (body.as_str(), mentions.as_deref());
    let edited = store::edit(&state.store, conversation, caller, seq, change).await?;
    Ok(axum::Json(edited))
}

/// The members a message of `author` names: positive ids, at most
/// `limits.max_mentions`, ascending, without the author; each a member of the
/// conversation (`422` naming `mentions` otherwise). With `all`, every other member
/// ([`everyone`]). A non-member author learns nothing of who is a member: `404` first,
/// as everywhere.
async fn named(
    state: &AppState,
    conversation: ConversationId,
    author: chatpipe_core::UserId,
    (raw, all): (Vec<i64>, bool),
) -> Result<Vec<chatpipe_core::UserId>, ApiError> {
    if all {
        return everyone(state, conversation, author).await;
    }
    if raw.is_empty() {
        return Ok(Vec::new());
    }
    let ids = user_ids("mentions", raw, usize::MAX)?;
    let max = state.limits.max_mentions;
    if ids.len() > max {
        return Err(ApiError::invalid(
            "mentions",
            format!(
                "names {} members; a message may name at most {max}",
                ids.len()
            ),
        ));
    }
    let store = &state.store;
    store
        .members
        .require(&store.pool, conversation, author)
        .await?;
    let users: Vec<chatpipe_core::UserId> = ids
        .into_iter()
        .filter(|u| *u != author.get())
        .map(chatpipe_core::UserId::of)
        .collect();
    let strangers = mentions::non_members(store, conversation, &users).await?;
    if !strangers.is_empty() {
        return Err(ApiError::invalid(
            "mentions",
            format!("users {strangers:?} are not members of the conversation"),
        ));
    }
    Ok(users)
}

/// `mentionAll`: every member but the author, if the author is an admin of a group of
/// at most `limits.max_mention_all_members` (403 for a plain member, 422 for a DIRECT
/// conversation or a larger group).
async fn everyone(
    state: &AppState,
    conversation: ConversationId,
    author: chatpipe_core::UserId,
) -> Result<Vec<chatpipe_core::UserId>, ApiError> {
    let all = mentions::everyone(&state.store, conversation, author).await?;
    let max = state.limits.max_mention_all_members;
    if all.kind != crate::domain::ConversationKind::Group {
        return Err(ApiError::invalid(
            "mentionAll",
            "names everyone of a group; this conversation is DIRECT",
        ));
    }
    if all.others.len() + 1 > max {
        return Err(ApiError::invalid(
            "mentionAll",
            format!(
                "is for groups of at most {max} members; this one has {}",
                all.others.len() + 1
            ),
        ));
    }
    if !all.admin {
        return Err(crate::store::StoreError::Forbidden {
            detail: "only the group's admins may name everyone".into(),
        }
        .into());
    }
    Ok(all.others)
}

/// `DELETE /conversations/{id}/messages/{seq}`: the sender, or an admin of the group,
/// erases the body. 204, and 204 again when repeated.
#[utoipa::path(
    delete,
    path = "/conversations/{id}/messages/{seq}",
    tag = "messages",
    summary = "Delete a message: its body is erased (the sender, or an admin of the group)",
    params(("id" = i64, Path, description = "the conversation", minimum = 1), ("seq" = i64, Path, description = "the message", minimum = 1)),
    responses(
        (status = 204, description = "Deleted (also when already deleted)"),
        (status = 403, description = "`/problems/forbidden`", body = crate::openapi::ProblemBody, content_type = "application/problem+json"),
        crate::openapi::Common,
        crate::openapi::Scoped,
        crate::openapi::Limited
    )
)]
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

/// `PUT /conversations/{id}/messages/{seq}/reactions/{key}`: the caller reacts to the
/// message with `key` (one emoji, or a short name). Idempotent.
#[utoipa::path(
    put,
    path = "/conversations/{id}/messages/{seq}/reactions/{key}",
    tag = "messages",
    summary = "React to a message (idempotent)",
    params(("id" = i64, Path, description = "the conversation", minimum = 1), ("seq" = i64, Path, description = "the message", minimum = 1),
           ("key" = String, Path, description = "one emoji (URL-encoded), or a short name of 1 to 32 of a-z, 0-9, _, +, -; an emoji's GitHub shortcode (`+1`) is that emoji")),
    responses(
        (status = 200, description = "The message's reactions as they are now", body = crate::store::reactions::Reactions),
        (status = 403, description = "`/problems/blocked`: a DIRECT conversation with a block either way", body = crate::openapi::ProblemBody, content_type = "application/problem+json"),
        (status = 409, description = "`/problems/message-deleted`; `/problems/reaction-limit`: the message has `limits.max_reaction_keys` other keys", body = crate::openapi::ProblemBody, content_type = "application/problem+json"),
        crate::openapi::Common,
        crate::openapi::Scoped,
        crate::openapi::Limited
    )
)]
pub async fn react(
    State(state): State<AppState>,
    Caller(caller): Caller,
    path: PathParams,
) -> Result<impl IntoResponse, ApiError> {
    reaction(state, caller, path, Change::Add).await
}

/// `DELETE /conversations/{id}/messages/{seq}/reactions/{key}`: the caller takes their
/// reaction back. Idempotent.
#[utoipa::path(
    delete,
    path = "/conversations/{id}/messages/{seq}/reactions/{key}",
    tag = "messages",
    summary = "Take a reaction back (idempotent)",
    params(("id" = i64, Path, description = "the conversation", minimum = 1), ("seq" = i64, Path, description = "the message", minimum = 1),
           ("key" = String, Path, description = "as for PUT")),
    responses(
        (status = 200, description = "The message's reactions as they are now", body = crate::store::reactions::Reactions),
        (status = 409, description = "`/problems/message-deleted`", body = crate::openapi::ProblemBody, content_type = "application/problem+json"),
        crate::openapi::Common,
        crate::openapi::Scoped,
        crate::openapi::Limited
    )
)]
pub async fn unreact(
    State(state): State<AppState>,
    Caller(caller): Caller,
    path: PathParams,
) -> Result<impl IntoResponse, ApiError> {
    reaction(state, caller, path, Change::Remove).await
}

async fn reaction(
    state: AppState,
    caller: chatpipe_core::UserId,
    path: PathParams,
    change: Change,
) -> Result<impl IntoResponse, ApiError> {
    state.rate.check(Kind::Send, caller)?;
    let conversation: ConversationId = path.get("id")?;
    let seq: Seq = path.get("seq")?;
    let key: ReactionKey = path.get("key")?;
    let max = state.limits.max_reaction_keys;
    let reactions =
        reactions::change(&state.store, (conversation, seq), caller, &key, change, max).await?;
    Ok(axum::Json(reactions))
}

/// `GET /conversations/{id}/messages?beforeSeq=&afterSeq=&limit=&threadRootSeq=`
#[utoipa::path(
    get,
    path = "/conversations/{id}/messages",
    tag = "messages",
    summary = "Page history (newest page, or before/after a seq)",
    params(("id" = i64, Path, description = "the conversation", minimum = 1), HistoryQuery),
    responses(
        (status = 200, description = "Messages in ascending seq", body = crate::store::history::HistoryPage),
        crate::openapi::Common,
        crate::openapi::Scoped
    )
)]
pub async fn history(
    State(state): State<AppState>,
    Caller(reader): Caller,
    ConversationPath(conversation): ConversationPath,
    Query(q): Query<HistoryQuery>,
) -> Result<impl IntoResponse, ApiError> {
    state.rate.check(Kind::Read, reader)?;
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
    let store = &state.store;
    Ok(axum::Json(match q.thread_root_seq {
        None => crate::store::history::history(store, conversation, reader, page, limit).await?,
        Some(root) => {
            let root = Seq::new(root).map_err(|_| {
                ApiError::bad_parameter(
                    "threadRootSeq",
                    format!("must be a positive seq, got {root}"),
                )
            })?;
            threads::page(store, conversation, reader, root, page, limit).await?
        }
    }))
}
