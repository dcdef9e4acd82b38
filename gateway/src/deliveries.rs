//! This gateway's partition of chat.deliveries: each fanout list becomes one frame,
//! queued for the sessions of the users on the list (and nobody else). The partition is
//! read from its end: after a restart, clients catch up over REST, not from old lists.
//! The reader runs on the processor runtime ([`chatpipe_runtime`]) on a thread of its
//! own: a registry or broker outage is waited out, an undecodable list goes to
//! `<topic>.dlq`, and a stalled reader turns `/readyz` red.

use chatpipe_runtime::schemas::header_text;
use chatpipe_runtime::{Decode, Failure, Position, Processor, WriterSchemas};
use chatpipe_schemas::delivery::{Listed, TYPING};

use crate::frames::Frame;
use crate::sessions::Sessions;

/// A chat.deliveries record: the list, and the trace it continues (fanout's
/// `traceparent` header; `None` for an event no writer traced).
pub struct Traced {
    pub listed: Listed,
    pub traceparent: Option<String>,
}

impl Decode for Traced {
    fn decode(
        message: &impl rdkafka::Message,
        schemas: &mut WriterSchemas,
    ) -> Result<Self, Failure> {
        Ok(Self {
            listed: Listed::decode(message, schemas)?,
            traceparent: header_text(message, chatpipe_core::telemetry::TRACEPARENT)
                .map(str::to_owned),
        })
    }
}

/// The reader's side: hands each list to [`push`] over a bounded channel
/// (`deliveries.max_pending_lists`). When the connections cannot keep up, the channel
/// fills and the reader waits: the partition backs up in Kafka, where the lag shows.
pub struct Pusher {
    pub lists: tokio::sync::mpsc::Sender<Traced>,
}

impl Processor for Pusher {
    type Record = Traced;

    fn apply(&mut self, _at: Position, d: Traced) -> Result<(), Failure> {
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
/// A fanout member's `presence.applied` may make sessions ready ([`crate::ready`]).
pub async fn push(mut lists: tokio::sync::mpsc::Receiver<Traced>, sessions: Sessions) {
    while let Some(traced) = lists.recv().await {
        let d = match traced.listed {
            Listed::List(d) => d,
            Listed::PresenceApplied(applied) => {
                sessions.presence_applied(applied);
                continue;
            }
        };
        tracing::debug!(
            conversation_id = %d.conversation_id,
            seq = ?d.seq,
            users = d.user_ids.len(),
            "fanout list"
        );
        let Some(frame) = Frame::of(&d) else {
            tracing::warn!(event_type = %d.event_type, "a fanout list of a type this gateway does not know: dropped");
            metrics::counter!("gateway_unknown_deliveries_total").increment(1);
            continue;
        };
        // A traced event's last span: the frame queued for its users' sockets.
        let span = traced.traceparent.as_deref().map(|parent| {
            let span = tracing::info_span!(
                "push",
                event_type = %d.event_type,
                conversation_id = %d.conversation_id,
                users = d.user_ids.len(),
            );
            chatpipe_core::telemetry::continue_trace(&span, parent);
            span
        });
        let entered = span.as_ref().map(tracing::Span::enter);
        let text = frame.text();
        metrics::counter!("gateway_deliveries_total").increment(1);
        // Push latency is measured from commits; typing is committed nowhere.
        let committed = (d.event_type != TYPING).then_some(d.occurred_at);
        sessions.push_committed(&d.user_ids, &text, committed);
        drop(entered);
        tokio::task::yield_now().await;
    }
}
