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
use crate::receipts::{ReceiptProducer, Said};
use crate::state::AppState;
use crate::store::reads as store;

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MarkRead {
    seq: i64,
}

/// `POST /conversations/{id}/read` `{seq}`.
///
/// Stream mode (the default): `202 {conversationId, acceptedSeq, lastReadSeq}`, the
/// receipt is on `chat.read-receipts` and the watermark moves within one debounce window.
/// Direct mode: `200 {lastReadSeq, advanced}`, moved in this request.
#[utoipa::path(
    post,
    path = "/conversations/{id}/read",
    tag = "read state",
    summary = "Move the caller's read watermark up to seq",
    params(("id" = i64, Path, description = "the conversation", minimum = 1)),
    request_body = MarkRead,
    responses(
        (status = 202, description = "Stream mode: the mark is on chat.read-receipts; the watermark moves within one debounce window", body = ReadAccepted),
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
    let position = store::read_position(&state.store, conversation, reader).await?;
    let accepted = forward(
        producer,
        Said::Read,
        (conversation, reader),
        seq,
        &position,
        position.last_read_seq,
    )
    .await?;
    let body = ReadAccepted {
        conversation_id: conversation,
        accepted_seq: accepted,
        last_read_seq: position.last_read_seq,
    };
    Ok((StatusCode::ACCEPTED, axum::Json(body)).into_response())
}

/// `POST /conversations/{id}/delivered` `{seq}`: the caller's devices got everything up
/// to `seq` (for clients without a WebSocket; a connected client acks over it).
///
/// Stream mode: `202 {conversationId, acceptedSeq, lastDeliveredSeq}`, the ack is on
/// `chat.delivery-acks`. Direct mode: `200 {lastDeliveredSeq, advanced}`.
#[utoipa::path(
    post,
    path = "/conversations/{id}/delivered",
    tag = "read state",
    summary = "The caller's devices got everything up to seq (delivered ticks)",
    params(("id" = i64, Path, description = "the conversation", minimum = 1)),
    request_body = MarkRead,
    responses(
        (status = 202, description = "Stream mode: the ack is on chat.delivery-acks", body = DeliveryAccepted),
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
    let position = store::read_position(&state.store, conversation, user).await?;
    let accepted = forward(
        producer,
        Said::Delivered,
        (conversation, user),
        seq,
        &position,
        position.last_delivered_seq,
    )
    .await?;
    let body = DeliveryAccepted {
        conversation_id: conversation,
        accepted_seq: accepted,
        last_delivered_seq: position.last_delivered_seq,
    };
    Ok((StatusCode::ACCEPTED, axum::Json(body)).into_response())
}

/// Clamps `seq` to the conversation's last seq, as the flush will, and produces the
/// receipt unless it cannot move the watermark (which `stands` at). Returns the clamped
/// seq.
/// `202` of a read mark in stream mode.
#[derive(serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReadAccepted {
    conversation_id: ConversationId,
    /// The seq sent on (the request's, clamped to the conversation's last seq).
    accepted_seq: i64,
    /// The watermark as it stood when the mark was accepted.
    last_read_seq: i64,
}

/// `202` of a delivery ack in stream mode.
#[derive(serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeliveryAccepted {
    conversation_id: ConversationId,
    accepted_seq: i64,
    last_delivered_seq: i64,
}

async fn forward(
    producer: &ReceiptProducer,
    said: Said,
    (conversation, user): (ConversationId, UserId),
    seq: Seq,
    position: &store::ReadPosition,
    stands: i64,
) -> Result<i64, ApiError> {
    let accepted = seq.get().min(position.last_seq);
    if accepted > stands {
        let receipt = ReadReceipt {
            conversation_id: conversation,
            user_id: user,
            // Above a watermark, which is never negative.
            seq: Seq::of(accepted),
            at: chatpipe_core::outbox::now(),
        };
        producer.send(said, &receipt).await?;
    } else {
        metrics::counter!("receipts_not_sent_total", "reason" => "no_advance").increment(1);
    }
    Ok(accepted)
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
