//! This gateway's partition of chat.deliveries: each fanout list becomes one frame,
//! queued for the sessions of the users on the list (and nobody else). The partition is
//! read from its end: after a restart, clients catch up over REST, not from old lists.
//! The reader runs on the processor runtime ([`chatpipe_runtime`]) on a thread of its
//! own: a registry or broker outage is waited out, an undecodable list goes to
//! `<topic>.dlq`, and a stalled reader turns `/readyz` red.

use chatpipe_runtime::{Failure, Position, Processor};
use chatpipe_schemas::delivery::{
    Delivery, DELIVERY_UPDATED, MESSAGE_DELETED, MESSAGE_EDITED, MESSAGE_NEW, READ_UPDATED, TYPING,
};
use serde_json::json;

use crate::sessions::Sessions;

/// The frame a client receives for a fanout list (docs/protocol.md); `None` for an
/// event type this gateway does not know (a newer fanout's), which it drops.
pub fn frame(d: &Delivery) -> Option<serde_json::Value> {
    let occurred_at = chrono::DateTime::from_timestamp_micros(d.occurred_at)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Micros, true));
    let kind = d.event_type.as_str();
    Some(match kind {
        // Light: the client fetches the message (history, afterSeq = seq - 1).
        MESSAGE_NEW | MESSAGE_EDITED | MESSAGE_DELETED if d.light => {
            json!({"type": kind, "conversationId": d.conversation_id, "seq": d.seq, "light": true})
        }
        MESSAGE_NEW => {
            let mut frame = json!({
                "type": kind,
                "conversationId": d.conversation_id,
                "seq": d.seq,
                "senderId": d.sender_id,
                "body": d.body,
                "createdAt": occurred_at,
            });
            // From fanouts that write it (delivery.avsc v5).
            if let Some(id) = d.client_msg_id {
                frame["clientMsgId"] = json!(id);
            }
            frame
        }
        MESSAGE_EDITED => json!({
            "type": kind,
            "conversationId": d.conversation_id,
            "seq": d.seq,
            "senderId": d.sender_id,
            "body": d.body,
            "editedAt": occurred_at,
        }),
        MESSAGE_DELETED => json!({
            "type": kind,
            "conversationId": d.conversation_id,
            "seq": d.seq,
            "senderId": d.sender_id,
            "deletedBy": d.user_id,
            "deletedAt": occurred_at,
        }),
        READ_UPDATED if d.light => {
            json!({"type": kind, "conversationId": d.conversation_id, "lastReadSeq": d.last_read_seq, "light": true})
        }
        READ_UPDATED => json!({
            "type": kind,
            "conversationId": d.conversation_id,
            "userId": d.user_id,
            "lastReadSeq": d.last_read_seq,
        }),
        DELIVERY_UPDATED if d.light => {
            json!({"type": kind, "conversationId": d.conversation_id, "lastDeliveredSeq": d.last_delivered_seq, "light": true})
        }
        DELIVERY_UPDATED => json!({
            "type": kind,
            "conversationId": d.conversation_id,
            "userId": d.user_id,
            "lastDeliveredSeq": d.last_delivered_seq,
        }),
        // Show it until 6 s after the last one (docs/protocol.md).
        TYPING => json!({
            "type": kind,
            "conversationId": d.conversation_id,
            "userId": d.user_id,
        }),
        _ => return None,
    })
}

/// The reader's side: hands each list to [`push`] over a bounded channel
/// (`deliveries.max_pending_lists`). When the connections cannot keep up, the channel
/// fills and the reader waits: the partition backs up in Kafka, where the lag shows.
pub struct Pusher {
    pub lists: tokio::sync::mpsc::Sender<Delivery>,
}

impl Processor for Pusher {
    type Record = Delivery;

    fn apply(&mut self, _at: Position, d: Delivery) -> Result<(), Failure> {
        metrics::gauge!("gateway_deliveries_pending")
            .set((self.lists.max_capacity() - self.lists.capacity()) as f64);
        self.lists
            .blocking_send(d)
            .map_err(|_| Failure::retriable(anyhow::anyhow!("the gateway is stopping")))
    }
}

/// The runtime's side: queues each list's frame for the sessions of its users, and lets
/// the connections write before the next one (a burst read from Kafka in one go must
/// not fill queues that are draining fine). Ends when the reader does.
pub async fn push(mut lists: tokio::sync::mpsc::Receiver<Delivery>, sessions: Sessions) {
    while let Some(d) = lists.recv().await {
        tracing::debug!(
            conversation_id = %d.conversation_id,
            seq = ?d.seq,
            users = d.user_ids.len(),
            "fanout list"
        );
        let Some(frame) = frame(&d) else {
            tracing::warn!(event_type = %d.event_type, "a fanout list of a type this gateway does not know: dropped");
            metrics::counter!("gateway_unknown_deliveries_total").increment(1);
            continue;
        };
        let text = frame.to_string();
        metrics::counter!("gateway_deliveries_total").increment(1);
        // Push latency is measured from commits; typing is committed nowhere.
        let committed = (d.event_type != TYPING).then_some(d.occurred_at);
        sessions.push_committed(&d.user_ids, &text, committed);
        tokio::task::yield_now().await;
    }
}
