use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use chatpipe_core::{ConversationId, Seq, UserId};
use chatpipe_schemas::receipt::ReadReceipt;
use serde::Deserialize;

use crate::domain::seq;
use crate::error::ApiError;
use crate::extract::{Caller, ConversationPath, Json, PathParams};
use crate::receipts::{ReceiptProducer, Said};
use crate::state::AppState;
use crate::store::reads as store;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MarkRead {
    seq: i64,
}

/// `POST /conversations/{id}/read` `{seq}`.
///
/// Stream mode (the default): `202 {conversationId, acceptedSeq, lastReadSeq}`, the
/// receipt is on `chat.read-receipts` and the watermark moves within one debounce window.
/// Direct mode: `200 {lastReadSeq, advanced}`, moved in this request.
pub async fn mark_read(
    State(state): State<AppState>,
    Caller(reader): Caller,
    ConversationPath(conversation): ConversationPath,
    Json(req): Json<MarkRead>,
) -> Result<Response, ApiError> {
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
    let body = serde_json::json!({
        "conversationId": conversation.get(),
        "acceptedSeq": accepted,
        "lastReadSeq": position.last_read_seq,
    });
    Ok((StatusCode::ACCEPTED, axum::Json(body)).into_response())
}

/// `POST /conversations/{id}/delivered` `{seq}`: the caller's devices got everything up
/// to `seq` (for clients without a WebSocket; a connected client acks over it).
///
/// Stream mode: `202 {conversationId, acceptedSeq, lastDeliveredSeq}`, the ack is on
/// `chat.delivery-acks`. Direct mode: `200 {lastDeliveredSeq, advanced}`.
pub async fn mark_delivered(
    State(state): State<AppState>,
    Caller(user): Caller,
    ConversationPath(conversation): ConversationPath,
    Json(req): Json<MarkRead>,
) -> Result<Response, ApiError> {
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
    let body = serde_json::json!({
        "conversationId": conversation.get(),
        "acceptedSeq": accepted,
        "lastDeliveredSeq": position.last_delivered_seq,
    });
    Ok((StatusCode::ACCEPTED, axum::Json(body)).into_response())
}

/// Clamps `seq` to the conversation's last seq, as the flush will, and produces the
/// receipt unless it cannot move the watermark (which `stands` at). Returns the clamped
/// seq.
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
pub async fn receipts(
    State(state): State<AppState>,
    Caller(caller): Caller,
    path: PathParams,
) -> Result<impl IntoResponse, ApiError> {
    let conversation: ConversationId = path.get("id")?;
    let seq: Seq = path.get("seq")?;
    Ok(axum::Json(
        store::receipts(&state.store, conversation, caller, seq).await?,
    ))
}
