//! `chat.read-receipts`: a member says they have read up to `seq`.

use apache_avro::types::Value;
use apache_avro::Schema;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::avro::{long, CodecError, Fields, Framed};
use crate::{ConversationId, Seq, UserId};

/// Which watermark a receipt moves: one record shape on two topics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mark {
    /// `chat.read-receipts`: `last_read_seq`, `read.updated`.
    Read,
    /// `chat.delivery-acks` (a device got it): `last_delivered_seq`, `delivery.updated`.
    Delivered,
}

impl Mark {
    /// In metrics' labels.
    pub fn label(self) -> &'static str {
        match self {
            Mark::Read => "read",
            Mark::Delivered => "delivered",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReadReceipt {
    pub conversation_id: ConversationId,
    pub user_id: UserId,
    pub seq: Seq,
    pub at: DateTime<Utc>,
}

/// Encodes receipts with the schema registered under one id.
#[derive(Debug, Clone)]
pub struct ReceiptCodec(Framed);

impl ReceiptCodec {
    pub fn new(schema_id: u32) -> Self {
        Self(Framed::new(
            crate::contract::READ_RECEIPTS.schema,
            schema_id,
        ))
    }

    pub fn encode(&self, receipt: &ReadReceipt) -> Vec<u8> {
        self.0.encode(crate::avro::record(vec![
            ("conversationId", long(receipt.conversation_id)),
            ("userId", long(receipt.user_id)),
            ("seq", long(receipt.seq)),
            ("at", crate::avro::micros(&receipt.at)),
        ]))
    }

    /// Decodes bytes written with this codec's schema id.
    pub fn decode(&self, bytes: &[u8]) -> Result<ReadReceipt, CodecError> {
        ReadReceipt::from_value(self.0.decode(bytes)?)
    }
}

impl ReadReceipt {
    /// Decodes a framed value whose writer schema the caller already holds (looked up by
    /// [`crate::avro::split_frame`]'s id): no await, for hot consumer loops.
    pub fn decode_with(writer: &Schema, bytes: &[u8]) -> Result<Self, CodecError> {
        Self::from_value(crate::avro::read_with(writer, bytes)?)
    }

    /// From a decoded record of any schema version, by field name.
    pub fn from_value(value: Value) -> Result<Self, CodecError> {
        let mut f = Fields::of(value, "ReadReceipt")?;
        Ok(Self {
            conversation_id: f.id("conversationId")?,
            user_id: f.id("userId")?,
            seq: f.id("seq")?,
            at: f.timestamp("at")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn receipts_round_trip_through_framed_avro() {
        let codec = ReceiptCodec::new(9);
        let r = ReadReceipt {
            conversation_id: ConversationId::of(7),
            user_id: UserId::of(20),
            seq: Seq::of(50),
            at: DateTime::from_timestamp_micros(1_764_480_000_000_001).unwrap(),
        };
        let bytes = codec.encode(&r);
        assert_eq!(&bytes[..5], &[0, 0, 0, 0, 9]);
        assert_eq!(codec.decode(&bytes).unwrap(), r);
        assert!(codec.decode(b"garbage").is_err());
    }
}
