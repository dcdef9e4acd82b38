//! `chat.deliveries`: a fanout list, one event and the users on one gateway to push it to.

use apache_avro::types::Value;
use apache_avro::Schema;
use serde::{Deserialize, Serialize};

use crate::avro::{long, opt_long, read_with, record, CodecError, Fields, Framed};
use crate::{ConversationId, Seq, UserId, Watermark};

pub const MESSAGE_NEW: &str = "message.new";
pub const READ_UPDATED: &str = "read.updated";
pub const MESSAGE_EDITED: &str = "message.edited";
pub const MESSAGE_DELETED: &str = "message.deleted";
pub const DELIVERY_UPDATED: &str = "delivery.updated";
pub const REACTION_ADDED: &str = "reaction.added";
pub const REACTION_REMOVED: &str = "reaction.removed";
/// A light `message.new` names these users: each hears of it at once.
pub const MENTION: &str = "mention";
/// A member's place in a thread moved: to their own devices only.
pub const THREAD_READ: &str = "thread.read";
/// Someone is typing: `userId`; never stored, from `chat.ephemeral`.
pub const TYPING: &str = "typing";
/// Not for clients: a fanout member tells a gateway how far it has applied
/// chat.presence (`presenceApplied`), so the gateway knows when a new session's pushes
/// are live.
pub const PRESENCE_APPLIED: &str = "presence.applied";

/// What one fanout member has applied of chat.presence, and which chat.events partitions
/// it joins now (a `presence.applied` list; delivery.avsc v8).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PresenceApplied {
    /// The fanout member: one per process.
    pub member: String,
    /// (chat.presence partition, the next offset to apply): every record before it is in
    /// the member's presence table.
    pub applied: Vec<(i32, i64)>,
    /// The chat.events partitions the member joins now.
    pub event_partitions: Vec<i32>,
    /// How many partitions chat.events has.
    pub event_partition_count: i32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Delivery {
    pub gateway_id: String,
    pub user_ids: Vec<UserId>,
    pub light: bool,
    pub event_type: String,
    pub conversation_id: ConversationId,
    pub seq: Option<Seq>,
    pub sender_id: Option<UserId>,
    pub body: Option<String>,
    pub user_id: Option<UserId>,
    pub last_read_seq: Option<Watermark>,
    pub last_delivered_seq: Option<Watermark>,
    /// Microseconds since the epoch: when the event was committed.
    pub occurred_at: i64,
    /// message.new: the sender's clientMsgId.
    pub client_msg_id: Option<uuid::Uuid>,
    /// reaction.added, reaction.removed: the reaction and how many hold it now.
    pub reaction_key: Option<String>,
    pub reaction_count: Option<i64>,
    /// message.new, message.edited (full): the members the message names.
    pub mentions: Vec<UserId>,
    /// message.new, mention: the reply's thread root; thread.read: the thread's root.
    pub thread_root_seq: Option<Seq>,
    /// thread.read: whether the reader follows the thread.
    pub following: Option<bool>,
}

/// A record of chat.deliveries: a fanout list, or a fanout member's `presence.applied`.
// Nearly every record is a list: boxing it would cost an allocation a list to save
// bytes on the rare presence.applied.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listed {
    List(Delivery),
    PresenceApplied(PresenceApplied),
}

#[derive(Debug, Clone)]
pub struct DeliveryCodec(Framed);

impl DeliveryCodec {
    pub fn new(schema_id: u32) -> Self {
        Self(Framed::new(crate::contract::DELIVERIES.schema, schema_id))
    }

    pub fn encode(&self, d: &Delivery) -> Vec<u8> {
        self.0.encode(record(vec![
            ("gatewayId", Value::String(d.gateway_id.clone())),
            (
                "userIds",
                Value::Array(d.user_ids.iter().map(|u| long(*u)).collect()),
            ),
            ("light", Value::Boolean(d.light)),
            ("eventType", Value::String(d.event_type.clone())),
            ("conversationId", long(d.conversation_id)),
            ("seq", opt_long(d.seq)),
            ("senderId", opt_long(d.sender_id)),
            ("body", crate::avro::opt_string(&d.body)),
            ("userId", opt_long(d.user_id)),
            ("lastReadSeq", opt_long(d.last_read_seq)),
            ("lastDeliveredSeq", opt_long(d.last_delivered_seq)),
            ("occurredAt", Value::TimestampMicros(d.occurred_at)),
            (
                "clientMsgId",
                match d.client_msg_id {
                    Some(id) => Value::Union(1, Box::new(Value::Uuid(id))),
                    None => Value::Union(0, Box::new(Value::Null)),
                },
            ),
            ("reactionKey", crate::avro::opt_string(&d.reaction_key)),
            ("reactionCount", opt_long(d.reaction_count)),
            (
                "mentions",
                Value::Array(d.mentions.iter().map(|u| long(*u)).collect()),
            ),
            ("threadRootSeq", opt_long(d.thread_root_seq)),
            (
                "following",
                match d.following {
                    Some(f) => Value::Union(1, Box::new(Value::Boolean(f))),
                    None => Value::Union(0, Box::new(Value::Null)),
                },
            ),
            ("presenceApplied", Value::Union(0, Box::new(Value::Null))),
        ]))
    }

    /// A `presence.applied` for gateway `gateway_id`, at `occurred_at` (microseconds since
    /// the epoch): no users, conversation 0, nothing else but `presenceApplied`.
    pub fn encode_presence_applied(
        &self,
        gateway_id: &str,
        applied: &PresenceApplied,
        occurred_at: i64,
    ) -> Vec<u8> {
        let null = || Value::Union(0, Box::new(Value::Null));
        self.0.encode(record(vec![
            ("gatewayId", Value::String(gateway_id.to_owned())),
            ("userIds", Value::Array(Vec::new())),
            ("light", Value::Boolean(false)),
            ("eventType", Value::String(PRESENCE_APPLIED.into())),
            ("conversationId", Value::Long(0)),
            ("seq", null()),
            ("senderId", null()),
            ("body", null()),
            ("userId", null()),
            ("lastReadSeq", null()),
            ("lastDeliveredSeq", null()),
            ("occurredAt", Value::TimestampMicros(occurred_at)),
            ("clientMsgId", null()),
            ("reactionKey", null()),
            ("reactionCount", null()),
            ("mentions", Value::Array(Vec::new())),
            ("threadRootSeq", null()),
            ("following", null()),
            (
                "presenceApplied",
                Value::Union(1, Box::new(applied.to_value())),
            ),
        ]))
    }
}

impl Listed {
    /// Decodes a framed value written with `writer` (any registered version).
    pub fn decode_with(writer: &Schema, bytes: &[u8]) -> Result<Self, CodecError> {
        let mut f = Fields::of(read_with(writer, bytes)?, "Delivery")?;
        let kind = match f.take("eventType")? {
            Value::String(kind) => kind,
            other => return Err(CodecError::Shape(format!("eventType is {other:?}"))),
        };
        if kind != PRESENCE_APPLIED {
            return Delivery::of_fields(kind, f).map(Self::List);
        }
        match f.take("presenceApplied")? {
            Value::Union(_, v) => PresenceApplied::of(*v).map(Self::PresenceApplied),
            other => PresenceApplied::of(other).map(Self::PresenceApplied),
        }
    }
}

impl Delivery {
    /// Decodes a framed value written with `writer` (any registered version).
    /// Decodes a framed fanout list written with `writer` (any registered version); a
    /// `presence.applied` is an error here (see [`Listed`]).
    pub fn decode_with(writer: &Schema, bytes: &[u8]) -> Result<Self, CodecError> {
        match Listed::decode_with(writer, bytes)? {
            Listed::List(d) => Ok(d),
            Listed::PresenceApplied(_) => Err(CodecError::Shape(
                "a presence.applied, not a fanout list".into(),
            )),
        }
    }

    fn of_fields(event_type: String, mut f: Fields) -> Result<Self, CodecError> {
        Ok(Self {
            gateway_id: f.string("gatewayId")?,
            user_ids: f.ids("userIds")?,
            light: f.boolean("light")?,
            event_type,
            conversation_id: f.id("conversationId")?,
            seq: f.opt_id("seq")?,
            sender_id: f.opt_id("senderId")?,
            body: f.opt_string("body")?,
            user_id: f.opt_id("userId")?,
            last_read_seq: f.opt_id("lastReadSeq")?,
            // Absent in lists written before delivered ticks.
            last_delivered_seq: if f.has("lastDeliveredSeq") {
                f.opt_id("lastDeliveredSeq")?
            } else {
                None
            },
            occurred_at: f.timestamp("occurredAt")?.timestamp_micros(),
            // Absent in lists written before it (delivery.avsc v5).
            client_msg_id: f.opt_uuid("clientMsgId")?,
            // Absent in lists written before reactions (delivery.avsc v6).
            reaction_key: if f.has("reactionKey") {
                f.opt_string("reactionKey")?
            } else {
                None
            },
            reaction_count: if f.has("reactionCount") {
                f.opt_long("reactionCount")?
            } else {
                None
            },
            mentions: if f.has("mentions") {
                f.ids("mentions")?
            } else {
                Vec::new()
            },
            // Absent in lists written before threads (delivery.avsc v7).
            thread_root_seq: if f.has("threadRootSeq") {
                f.opt_id("threadRootSeq")?
            } else {
                None
            },
            following: f.opt_boolean("following")?,
        })
    }
}

impl PresenceApplied {
    fn to_value(&self) -> Value {
        let int = |v: i32| Value::Int(v);
        record(vec![
            ("member", Value::String(self.member.clone())),
            (
                "applied",
                Value::Array(
                    self.applied
                        .iter()
                        .map(|(p, next)| {
                            record(vec![("partition", int(*p)), ("next", long(*next))])
                        })
                        .collect(),
                ),
            ),
            (
                "eventPartitions",
                Value::Array(self.event_partitions.iter().map(|p| int(*p)).collect()),
            ),
            ("eventPartitionCount", int(self.event_partition_count)),
        ])
    }

    fn of(value: Value) -> Result<Self, CodecError> {
        let mut f = Fields::of(value, "PresenceApplied")?;
        let int = |name: &str, v: i64| {
            i32::try_from(v).map_err(|_| CodecError::Shape(format!("{name} {v} is not an int")))
        };
        let applied = match f.take("applied")? {
            Value::Array(items) => items
                .into_iter()
                .map(|item| {
                    let mut o = Fields::of(item, "PresenceOffset")?;
                    Ok((int("partition", o.long("partition")?)?, o.long("next")?))
                })
                .collect::<Result<_, CodecError>>()?,
            other => return Err(CodecError::Shape(format!("applied is {other:?}"))),
        };
        let event_partitions = match f.take("eventPartitions")? {
            Value::Array(items) => items
                .into_iter()
                .map(|v| match v {
                    Value::Int(p) => Ok(p),
                    other => Err(CodecError::Shape(format!(
                        "eventPartitions holds {other:?}"
                    ))),
                })
                .collect::<Result<_, CodecError>>()?,
            other => return Err(CodecError::Shape(format!("eventPartitions is {other:?}"))),
        };
        Ok(Self {
            member: f.string("member")?,
            applied,
            event_partitions,
            event_partition_count: int("eventPartitionCount", f.long("eventPartitionCount")?)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deliveries_round_trip_full_and_light() {
        let codec = DeliveryCodec::new(5);
        let full = Delivery {
            gateway_id: "gw-0".into(),
            user_ids: vec![UserId::of(1), UserId::of(2), UserId::of(3)],
            light: false,
            event_type: MESSAGE_NEW.into(),
            conversation_id: ConversationId::of(9),
            seq: Some(Seq::of(4)),
            sender_id: Some(UserId::of(1)),
            body: Some("hi".into()),
            user_id: None,
            last_read_seq: None,
            last_delivered_seq: None,
            occurred_at: 1_764_480_000_000_001,
            client_msg_id: Some(uuid::Uuid::from_u128(7)),
            reaction_key: None,
            reaction_count: None,
            mentions: vec![UserId::of(2)],
            thread_root_seq: Some(Seq::of(3)),
            following: None,
        };
        let light = Delivery {
            light: true,
            sender_id: None,
            body: None,
            client_msg_id: None,
            ..full.clone()
        };
        for d in [full, light] {
            let bytes = codec.encode(&d);
            assert_eq!(Delivery::decode_with(codec.0.schema(), &bytes).unwrap(), d);
        }
        assert!(Delivery::decode_with(codec.0.schema(), b"junk").is_err());
    }

    #[test]
    fn a_presence_applied_round_trips_and_is_no_fanout_list() {
        let codec = DeliveryCodec::new(5);
        let applied = PresenceApplied {
            member: "fanout-1".into(),
            applied: vec![(0, 12), (3, 7)],
            event_partitions: vec![1, 2],
            event_partition_count: 3,
        };
        let bytes = codec.encode_presence_applied("gw-0", &applied, 1_764_480_000_000_001);
        assert_eq!(
            Listed::decode_with(codec.0.schema(), &bytes).unwrap(),
            Listed::PresenceApplied(applied)
        );
        assert!(Delivery::decode_with(codec.0.schema(), &bytes).is_err());
    }
}
