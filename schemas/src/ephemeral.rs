//! `chat.ephemeral`: signals that matter for seconds (typing), never stored.

use apache_avro::types::Value;
use apache_avro::Schema;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::avro::{long, read_with, record, CodecError, Fields, Framed};
use crate::{ConversationId, UserId};

pub const TYPING: &str = "typing";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Ephemeral {
    /// `typing`.
    pub kind: String,
    pub conversation_id: ConversationId,
    pub user_id: UserId,
    pub at: DateTime<Utc>,
}

#[derive(Debug, Clone)]
pub struct EphemeralCodec(Framed);

impl EphemeralCodec {
    pub fn new(schema_id: u32) -> Self {
        Self(Framed::new(crate::contract::EPHEMERAL.schema, schema_id))
    }

    pub fn encode(&self, e: &Ephemeral) -> Vec<u8> {
        self.0.encode(record(vec![
            ("type", Value::String(e.kind.clone())),
            ("conversationId", long(e.conversation_id)),
            ("userId", long(e.user_id)),
            ("at", crate::avro::micros(&e.at)),
        ]))
    }
}

impl Ephemeral {
    /// Decodes a framed value written with `writer` (any registered version).
    pub fn decode_with(writer: &Schema, bytes: &[u8]) -> Result<Self, CodecError> {
        let mut f = Fields::of(read_with(writer, bytes)?, "Ephemeral")?;
        Ok(Self {
            kind: f.string("type")?,
            conversation_id: f.id("conversationId")?,
            user_id: f.id("userId")?,
            at: f.timestamp("at")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typing_round_trips_and_junk_is_refused() {
        let codec = EphemeralCodec::new(9);
        let e = Ephemeral {
            kind: TYPING.into(),
            conversation_id: ConversationId::of(7),
            user_id: UserId::of(3),
            at: DateTime::from_timestamp_micros(1_764_480_000_123_456).unwrap(),
        };
        let bytes = codec.encode(&e);
        assert_eq!(Ephemeral::decode_with(codec.0.schema(), &bytes).unwrap(), e);
        assert!(Ephemeral::decode_with(codec.0.schema(), b"junk").is_err());
    }
}
