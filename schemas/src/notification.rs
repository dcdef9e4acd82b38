//! `chat.notifications`: what an offline member should be told (the notifications
//! processor's output, keyed by user id).

use apache_avro::types::Value;
use apache_avro::Schema;

use crate::avro::{long, opt_long, opt_string, read_with, record, CodecError, Fields, Framed};
use crate::{ConversationId, Seq, UserId};

/// Why the member hears of it: the strongest reason among the collapsed messages.
pub const MENTION: &str = "mention";
pub const REPLY: &str = "reply";
pub const MESSAGE: &str = "message";

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Notification {
    pub user_id: UserId,
    pub conversation_id: ConversationId,
    /// [`MENTION`], [`REPLY`] or [`MESSAGE`].
    pub kind: String,
    pub count: i64,
    pub first_seq: Seq,
    pub last_seq: Seq,
    pub sender_id: UserId,
    pub preview: Option<String>,
    pub thread_root_seq: Option<Seq>,
    /// Microseconds since the epoch: when the newest message was sent.
    pub occurred_at: i64,
}

#[derive(Debug, Clone)]
pub struct NotificationCodec(Framed);

impl NotificationCodec {
    pub fn new(schema_id: u32) -> Self {
        Self(Framed::new(
            crate::contract::NOTIFICATIONS.schema,
            schema_id,
        ))
    }

    pub fn encode(&self, n: &Notification) -> Vec<u8> {
        self.0.encode(record(vec![
            ("userId", long(n.user_id)),
            ("conversationId", long(n.conversation_id)),
            ("kind", Value::String(n.kind.clone())),
            ("count", Value::Long(n.count)),
            ("firstSeq", long(n.first_seq)),
            ("lastSeq", long(n.last_seq)),
            ("senderId", long(n.sender_id)),
            ("preview", opt_string(&n.preview)),
            ("threadRootSeq", opt_long(n.thread_root_seq)),
            ("occurredAt", Value::TimestampMicros(n.occurred_at)),
        ]))
    }
}

impl Notification {
    /// Decodes a framed value written with `writer` (any registered version).
    pub fn decode_with(writer: &Schema, bytes: &[u8]) -> Result<Self, CodecError> {
        let mut f = Fields::of(read_with(writer, bytes)?, "Notification")?;
        Ok(Self {
            user_id: f.id("userId")?,
            conversation_id: f.id("conversationId")?,
            kind: f.string("kind")?,
            count: f.long("count")?,
            first_seq: f.id("firstSeq")?,
            last_seq: f.id("lastSeq")?,
            sender_id: f.id("senderId")?,
            preview: f.opt_string("preview")?,
            thread_root_seq: f.opt_id("threadRootSeq")?,
            occurred_at: f.timestamp("occurredAt")?.timestamp_micros(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_notification_round_trips() {
        let codec = NotificationCodec::new(9);
        let n = Notification {
            user_id: UserId::of(20),
            conversation_id: ConversationId::of(7),
            kind: MENTION.into(),
            count: 3,
            first_seq: Seq::of(40),
            last_seq: Seq::of(42),
            sender_id: UserId::of(10),
            preview: Some("@bob look".into()),
            thread_root_seq: Some(Seq::of(12)),
            occurred_at: 1_764_480_000_000_001,
        };
        let bytes = codec.encode(&n);
        let schema = Schema::parse_str(crate::contract::NOTIFICATIONS.schema).unwrap();
        assert_eq!(Notification::decode_with(&schema, &bytes).unwrap(), n);
    }
}
