//! What a client says over the socket. Clients send over REST; the one thing they say
//! here is `{"type": "ack", "conversationId": …, "seq": …}`: "this device got every
//! message of the conversation up to seq" (delivered ticks). The gateway produces it
//! onto `chat.delivery-acks` as a receipt record; the receipts processor applies it
//! (membership checked there: a non-member's ack is dropped and counted; a seq above
//! the last one is clamped). Acks are cumulative, so one lost to a broker outage is
//! made good by the next: they are sent without waiting for the broker.

use chatpipe_core::{ConversationId, Seq, UserId};
use chatpipe_schemas::receipt::{ReadReceipt, ReceiptCodec};
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde::Deserialize;

#[derive(Clone)]
pub struct Acks {
    pub producer: FutureProducer,
    pub codec: ReceiptCodec,
    pub topic: String,
}

/// A client frame, by its `type`.
#[derive(Debug, PartialEq, Eq)]
pub enum ClientFrame {
    Ack {
        conversation: ConversationId,
        seq: Seq,
    },
    /// A type this gateway does not know (a newer client's): ignored.
    Unknown,
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
        Some(_) => Ok(ClientFrame::Unknown),
        None => Err("no \"type\"".into()),
    }
}

impl Acks {
    /// Acts on one text frame of `user`'s connection.
    pub fn handle(&self, user: UserId, text: &str) {
        let (conversation, seq) = match parse(text) {
            Ok(ClientFrame::Ack { conversation, seq }) => (conversation, seq),
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
        let key = conversation.to_string();
        let payload = self.codec.encode(&receipt);
        let record = FutureRecord::to(&self.topic).key(&key).payload(&payload);
        match self.producer.send_result(record) {
            Ok(delivery) => {
                tokio::spawn(async move {
                    let result = match delivery.await {
                        Ok(Ok(_)) => "produced",
                        _ => "failed",
                    };
                    metrics::counter!("gateway_acks_total", "result" => result).increment(1);
                });
            }
            // The producer's queue is full (the broker is away): the next ack covers it.
            Err(_) => metrics::counter!("gateway_acks_total", "result" => "dropped").increment(1),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acks_parse_and_anything_else_is_unknown_or_invalid() {
        assert_eq!(
            parse(r#"{"type":"ack","conversationId":7,"seq":12}"#),
            Ok(ClientFrame::Ack {
                conversation: ConversationId::of(7),
                seq: Seq::of(12)
            })
        );
        assert_eq!(
            parse(r#"{"type":"typing","conversationId":7}"#),
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
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}
