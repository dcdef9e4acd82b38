//! `chat.presence`: which gateway holds a user's sessions, with a lease.

use apache_avro::types::Value;
use apache_avro::Schema;
use serde::{Deserialize, Serialize};

use crate::avro::{long, read_with, record, CodecError, Fields, Framed};
use crate::UserId;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Presence {
    pub user_id: UserId,
    pub gateway_id: String,
    /// The chat.deliveries partition the gateway reads.
    pub partition: i32,
    pub sessions: i32,
    /// Milliseconds since the epoch; past it, the entry counts as offline.
    pub lease_expires_at: i64,
}

/// The record key of `user` on `gateway`: `<userId>@<gatewayId>`.
pub fn key(user: UserId, gateway: &str) -> String {
    format!("{user}@{gateway}")
}

/// The user and gateway of a record key (tombstones have only the key).
pub fn parse_key(key: &str) -> Option<(UserId, &str)> {
    let (user, gateway) = key.split_once('@')?;
    Some((user.parse().ok()?, gateway))
}

#[derive(Debug, Clone)]
pub struct PresenceCodec(Framed);

impl PresenceCodec {
    pub fn new(schema_id: u32) -> Self {
        Self(Framed::new(crate::contract::PRESENCE.schema, schema_id))
    }

    pub fn encode(&self, p: &Presence) -> Vec<u8> {
        self.0.encode(record(vec![
            ("userId", long(p.user_id)),
            ("gatewayId", Value::String(p.gateway_id.clone())),
            ("partition", Value::Int(p.partition)),
            ("sessions", Value::Int(p.sessions)),
            ("leaseExpiresAt", Value::TimestampMillis(p.lease_expires_at)),
        ]))
    }
}

impl Presence {
    /// Decodes a framed value written with `writer` (any registered version).
    pub fn decode_with(writer: &Schema, bytes: &[u8]) -> Result<Self, CodecError> {
        let mut f = Fields::of(read_with(writer, bytes)?, "Presence")?;
        Ok(Self {
            user_id: f.id("userId")?,
            gateway_id: f.string("gatewayId")?,
            partition: i32::try_from(f.long("partition")?)
                .map_err(|_| CodecError::Shape("partition out of range".into()))?,
            sessions: i32::try_from(f.long("sessions")?)
                .map_err(|_| CodecError::Shape("sessions out of range".into()))?,
            lease_expires_at: f.millis("leaseExpiresAt")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presence_round_trips_and_keys_parse() {
        let codec = PresenceCodec::new(3);
        let p = Presence {
            user_id: UserId::of(42),
            gateway_id: "gw-1".into(),
            partition: 1,
            sessions: 2,
            lease_expires_at: 1_764_480_000_123,
        };
        let bytes = codec.encode(&p);
        assert_eq!(Presence::decode_with(codec.0.schema(), &bytes).unwrap(), p);
        assert_eq!(
            parse_key(&key(UserId::of(42), "gw-1")),
            Some((UserId::of(42), "gw-1"))
        );
        assert_eq!(parse_key("0@gw"), None);
        assert_eq!(parse_key("42"), None);
        assert_eq!(parse_key("x@gw"), None);
        assert!(Presence::decode_with(codec.0.schema(), b"\0\0\0\0\x03\xff").is_err());
    }
}
