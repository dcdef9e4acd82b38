//! What a client says over the socket. Clients send messages and reads over REST; here
//! they say two things, both signals nobody stores as they are:
//!
//! - `{"type": "ack", "conversationId": …, "seq": …}`: "this device got every message of
//!   the conversation up to seq" (delivered ticks). Produced onto `chat.delivery-acks` as
//!   a receipt record; the receipts processor applies it (membership checked there: a
//!   non-member's ack is dropped and counted; a seq above the last one is clamped). Acks
//!   are cumulative, so one lost to a broker outage is made good by the next: they are
//!   sent without waiting for the broker.
//! - `{"type": "typing", "conversationId": …}`: produced onto `chat.ephemeral` (never
//!   PostgreSQL, never `chat.events`), at most once per `typing_interval_ms` per
//!   conversation and connection; fanout checks membership and throttles per user.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use chatpipe_core::kafka::FutureProducer;
use chatpipe_core::{ConversationId, Seq, UserId};
use chatpipe_schemas::ephemeral::{Ephemeral, EphemeralCodec, TYPING};
use chatpipe_schemas::receipt::{ReadReceipt, ReceiptCodec};
use rdkafka::producer::FutureRecord;
use serde::Deserialize;

#[derive(Clone)]
pub struct Signals {
    pub producer: FutureProducer,
    pub acks_codec: ReceiptCodec,
    pub acks_topic: String,
    pub ephemeral_codec: EphemeralCodec,
    pub ephemeral_topic: String,
    /// At most one typing signal per conversation per this long leaves a connection.
    pub typing_interval: Duration,
}

/// A client frame, by its `type`.
#[derive(Debug, PartialEq, Eq)]
pub enum ClientFrame {
    Ack {
        conversation: ConversationId,
        seq: Seq,
    },
    Typing {
        conversation: ConversationId,
    },
    /// A type this gateway does not know (a newer client's): ignored.
    Unknown,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct TypingFields {
    #[allow(dead_code)]
    r#type: String,
    conversation_id: i64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct AckFields {
    #[allow(dead_code)]
    r#type: String,
    conversation_id: i64,
    seq: i64,
}

/// Reads a client's text frame; `Err` says what is wrong with it.
pub fn parse(text: &str) -> Result<ClientFrame, String> {
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    match value.get("type").and_then(|t| t.as_str()) {
        Some("ack") => {
            let f: AckFields = serde_json::from_value(value).map_err(|e| format!("ack: {e}"))?;
            Ok(ClientFrame::Ack {
                conversation: ConversationId::new(f.conversation_id)
                    .map_err(|e| format!("ack: conversationId: {e}"))?,
                seq: Seq::new(f.seq).map_err(|e| format!("ack: seq: {e}"))?,
            })
        }
        Some("typing") => {
            let f: TypingFields =
                serde_json::from_value(value).map_err(|e| format!("typing: {e}"))?;
            Ok(ClientFrame::Typing {
                conversation: ConversationId::new(f.conversation_id)
                    .map_err(|e| format!("typing: conversationId: {e}"))?,
            })
        }
        Some(_) => Ok(ClientFrame::Unknown),
        None => Err("no \"type\"".into()),
    }
}

/// One connection's side: who it is, and when it last passed on typing per conversation.
pub struct ConnectionSignals {
    signals: Signals,
    user: UserId,
    typed: HashMap<ConversationId, Instant>,
}

/// Conversations a connection remembers typing in; past it, the memory starts over.
const MAX_TYPING_REMEMBERED: usize = 64;

impl Signals {
    /// The signals of one of `user`'s connections.
    pub fn connection(&self, user: UserId) -> ConnectionSignals {
        ConnectionSignals {
            signals: self.clone(),
            user,
            typed: HashMap::new(),
        }
    }
}

impl ConnectionSignals {
    /// Acts on one text frame of the connection.
    pub fn handle(&mut self, text: &str) {
        let user = self.user;
        let (conversation, seq) = match parse(text) {
            Ok(ClientFrame::Ack { conversation, seq }) => (conversation, seq),
            Ok(ClientFrame::Typing { conversation }) => return self.typing(conversation),
            Ok(ClientFrame::Unknown) => {
                metrics::counter!("gateway_client_frames_total", "kind" => "unknown").increment(1);
                return;
            }
            Err(why) => {
                metrics::counter!("gateway_client_frames_total", "kind" => "invalid").increment(1);
                tracing::debug!(%user, why, "a client frame that is not one: ignored");
                return;
            }
        };
        metrics::counter!("gateway_client_frames_total", "kind" => "ack").increment(1);
        let receipt = ReadReceipt {
            conversation_id: conversation,
            user_id: user,
            seq,
            at: chatpipe_core::outbox::now(),
        };
        let payload = self.signals.acks_codec.encode(&receipt);
        self.produce(
            &self.signals.acks_topic,
            conversation,
            payload,
            "gateway_acks_total",
        );
    }

    fn typing(&mut self, conversation: ConversationId) {
        metrics::counter!("gateway_client_frames_total", "kind" => "typing").increment(1);
        let now = Instant::now();
        if self
            .typed
            .get(&conversation)
            .is_some_and(|at| now.duration_since(*at) < self.signals.typing_interval)
        {
            metrics::counter!("gateway_typing_total", "result" => "throttled").increment(1);
            return;
        }
        if self.typed.len() >= MAX_TYPING_REMEMBERED {
            self.typed.clear();
        }
        self.typed.insert(conversation, now);
        let signal = Ephemeral {
            kind: TYPING.into(),
            conversation_id: conversation,
            user_id: self.user,
            at: chatpipe_core::outbox::now(),
        };
        let payload = self.signals.ephemeral_codec.encode(&signal);
        self.produce(
            &self.signals.ephemeral_topic,
            conversation,
            payload,
            "gateway_typing_total",
        );
    }

    /// Hands a record to the producer without waiting; counts what became of it.
    fn produce(
        &self,
        topic: &str,
        conversation: ConversationId,
        payload: Vec<u8>,
        metric: &'static str,
    ) {
        let key = conversation.to_string();
        let record = FutureRecord::to(topic).key(&key).payload(&payload);
        match self.signals.producer.send_result(record) {
            Ok(delivery) => {
                tokio::spawn(async move {
                    let result = match delivery.await {
                        Ok(Ok(_)) => "produced",
                        _ => "failed",
                    };
                    metrics::counter!(metric, "result" => result).increment(1);
                });
            }
            // The producer's queue is full (the broker is away): a signal is worth
            // nothing late, and the next ack covers a lost one.
            Err(_) => metrics::counter!(metric, "result" => "dropped").increment(1),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acks_and_typing_parse_and_anything_else_is_unknown_or_invalid() {
        assert_eq!(
            parse(r#"{"type":"ack","conversationId":7,"seq":12}"#),
            Ok(ClientFrame::Ack {
                conversation: ConversationId::of(7),
                seq: Seq::of(12)
            })
        );
        assert_eq!(
            parse(r#"{"type":"typing","conversationId":7}"#),
            Ok(ClientFrame::Typing {
                conversation: ConversationId::of(7)
            })
        );
        assert_eq!(
            parse(r#"{"type":"wave","conversationId":7}"#),
            Ok(ClientFrame::Unknown)
        );
        for bad in [
            "ack",
            "{}",
            r#"{"type":"ack","conversationId":7}"#,
            r#"{"type":"ack","conversationId":0,"seq":1}"#,
            r#"{"type":"ack","conversationId":7,"seq":0}"#,
            r#"{"type":"ack","conversationId":"7","seq":1}"#,
            r#"{"type":"ack","conversationId":7,"seq":1,"extra":true}"#,
            r#"{"type":"typing"}"#,
            r#"{"type":"typing","conversationId":-1}"#,
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}
