use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use chatpipe_core::{ConversationId, Seq, UserId};
use chatpipe_schemas::receipt::ReadReceipt;
use serde::Deserialize;

use crate::domain::seq;
use crate::error::ApiError;
use crate::extract::{Caller, ConversationPath, Json, PathParams};
use crate::rate::Kind;
use crate::receipts::ReceiptProducer;
use crate::state::AppState;
use crate::store::reads as store;
use chatpipe_schemas::receipt::Mark;

#[derive(Deserialize, utoipa::ToSchema)]
pub struct MarkRead {
    seq: i64,
}

/// `POST /conversations/{id}/read` `{seq}`.
///
/// Stream mode (the default): `202 {conversationId, acceptedSeq}`, the receipt is on
/// `chat.read-receipts` and the watermark moves within one debounce window. No database
/// round trip: the receipts processor's flush checks membership (a non-member's receipt
/// moves nothing) and clamps to the last seq, so a read storm reaches PostgreSQL as one
/// UPDATE per window, and the answer says nothing about membership (a non-member and an
/// unknown conversation get what a member gets). Direct mode: `200 {lastReadSeq,
/// advanced}`, moved in this request.
#[utoipa::path(
    post,
    path = "/conversations/{id}/read",
    tag = "read state",
    summary = "Move the caller's read watermark up to seq",
    params(("id" = i64, Path, description = "the conversation", minimum = 1)),
    request_body = MarkRead,
    responses(
        (status = 202, description = "Stream mode: the mark is on chat.read-receipts; the watermark moves within one debounce window, if the caller is a member (the answer does not say)", body = Accepted),
        (status = 200, description = "Direct mode: moved in this request", body = crate::store::reads::ReadOutcome),
        crate::openapi::Common,
        crate::openapi::Scoped,
        crate::openapi::WithBody
    )
)]
pub async fn mark_read(
    State(state): State<AppState>,
    Caller(reader): Caller,
    ConversationPath(conversation): ConversationPath,
    Json(req): Json<MarkRead>,
) -> Result<Response, ApiError> {
    state.rate.check(Kind::Read, reader)?;
    let seq = seq("seq", req.seq)?;
    let Some(producer) = &state.receipts else {
        let outcome = store::mark_read(&state.store, conversation, reader, seq).await?;
        return Ok(axum::Json(outcome).into_response());
    };
    forward(producer, Mark::Read, (conversation, reader), seq).await?;
    let body = Accepted {
        conversation_id: conversation,
        accepted_seq: seq.get(),
    };
    Ok((StatusCode::ACCEPTED, axum::Json(body)).into_response())
}

/// `POST /conversations/{id}/delivered` `{seq}`: the caller's devices got everything up
/// to `seq` (for clients without a WebSocket; a connected client acks over it).
///
/// Stream mode: `202 {conversationId, acceptedSeq}`, the ack is on `chat.delivery-acks`,
/// with no database round trip (as reads). Direct mode: `200 {lastDeliveredSeq,
/// advanced}`.
#[utoipa::path(
    post,
    path = "/conversations/{id}/delivered",
    tag = "read state",
    summary = "The caller's devices got everything up to seq (delivered ticks)",
    params(("id" = i64, Path, description = "the conversation", minimum = 1)),
    request_body = MarkRead,
    responses(
        (status = 202, description = "Stream mode: the ack is on chat.delivery-acks; the delivery watermark moves within one debounce window, if the caller is a member (the answer does not say)", body = Accepted),
        (status = 200, description = "Direct mode: moved in this request", body = crate::store::reads::DeliveredOutcome),
        crate::openapi::Common,
        crate::openapi::Scoped,
        crate::openapi::WithBody
    )
)]
pub async fn mark_delivered(
    State(state): State<AppState>,
    Caller(user): Caller,
    ConversationPath(conversation): ConversationPath,
    Json(req): Json<MarkRead>,
) -> Result<Response, ApiError> {
    state.rate.check(Kind::Read, user)?;
    let seq = seq("seq", req.seq)?;
    let Some(producer) = &state.receipts else {
        let outcome = store::mark_delivered(&state.store, conversation, user, seq).await?;
        return Ok(axum::Json(outcome).into_response());
    };
    forward(producer, Mark::Delivered, (conversation, user), seq).await?;
    let body = Accepted {
        conversation_id: conversation,
        accepted_seq: seq.get(),
    };
    Ok((StatusCode::ACCEPTED, axum::Json(body)).into_response())
}

/// `202` of a read mark or a delivery ack in stream mode: accepted, not yet applied.
#[derive(serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Accepted {
    conversation_id: ConversationId,
    /// The seq sent on, as requested. The flush clamps it to the conversation's last seq
    /// and applies it only if it moves the caller's watermark and the caller is a member.
    accepted_seq: i64,
}

/// Produces the receipt to the receipts processor's topic (`503` if Kafka does not
/// acknowledge it in time).
async fn forward(
    producer: &ReceiptProducer,
    mark: Mark,
    (conversation, user): (ConversationId, UserId),
    seq: Seq,
) -> Result<(), ApiError> {
    let receipt = ReadReceipt {
        conversation_id: conversation,
        user_id: user,
        seq,
        at: chatpipe_core::outbox::now(),
    };
    Ok(producer.send(mark, &receipt).await?)
}

/// `GET /conversations/{id}/messages/{seq}/receipts`
#[utoipa::path(
    get,
    path = "/conversations/{id}/messages/{seq}/receipts",
    tag = "read state",
    summary = "Read by N and delivered to N (groups); read and delivered (DIRECT)",
    params(("id" = i64, Path, description = "the conversation", minimum = 1), ("seq" = i64, Path, description = "the message", minimum = 1)),
    responses(
        (status = 200, description = "The message's receipts", body = crate::store::reads::Receipts),
        crate::openapi::Common,
        crate::openapi::Scoped
    )
)]
pub async fn receipts(
    State(state): State<AppState>,
    Caller(caller): Caller,
    path: PathParams,
) -> Result<impl IntoResponse, ApiError> {
    state.rate.check(Kind::Read, caller)?;
    let conversation: ConversationId = path.get("id")?;
    let seq: Seq = path.get("seq")?;
    Ok(axum::Json(
        store::receipts(&state.store, conversation, caller, seq).await?,
    ))
}
