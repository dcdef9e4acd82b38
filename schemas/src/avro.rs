//! `ChatEvent` <-> Avro `chatpipe.events.ChatEvent`, in the Confluent wire format
//! (magic byte 0, 4-byte big-endian schema id, Avro binary body).
//!
//! The mapping is written out field by field rather than derived: the Avro record is
//! the published contract and should not change because a Rust type was renamed.

use std::sync::Arc;

use apache_avro::types::Value;
use apache_avro::Schema;
use chrono::{DateTime, Utc};
use schema_registry_converter::schema_registry_common::get_payload;

use crate::{
    ChatEvent, ConversationCreated, ConversationId, DeliveryUpdated, MemberJoined, MemberLeft,
    MemberRoleChanged, MessageDeleted, MessageEdited, MessageNew, Reaction, ReadUpdated, Role,
    ThreadRead,
};

#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    #[error("not Confluent-framed Avro: {0}")]
    Framing(String),
    #[error("schema id {found} is not the one this decoder knows ({expected})")]
    UnknownSchemaId { found: u32, expected: u32 },
    #[error("avro: {0}")]
    Avro(#[from] Box<apache_avro::Error>),
    #[error("the record does not match the ChatEvent contract: {0}")]
    Shape(String),
}

impl From<apache_avro::Error> for CodecError {
    fn from(e: apache_avro::Error) -> Self {
        Self::Avro(Box::new(e))
    }
}

/// One schema under one registered id: Avro values in and out of the Confluent frame.
/// Cloning is cheap (the parsed schema is shared): services hold codecs in state that
/// axum clones for every request, and a parsed schema is a tree of maps.
#[derive(Debug, Clone)]
pub struct Framed {
    schema: Arc<Schema>,
    schema_id: u32,
}

impl Framed {
    pub fn new(schema_json: &str, schema_id: u32) -> Self {
        let schema =
            Schema::parse_str(schema_json).expect("the schemas in schemas/ are valid Avro");
        Self {
            schema: Arc::new(schema),
            schema_id,
        }
    }

    pub fn schema_id(&self) -> u32 {
        self.schema_id
    }

    pub fn schema(&self) -> &Schema {
        &self.schema
    }

    /// Panics if `value` does not match the schema: values are built by this crate's
    /// own mappings, which the tests cover.
    pub fn encode(&self, value: Value) -> Vec<u8> {
        let datum = apache_avro::writer::datum::GenericDatumWriter::builder(&self.schema)
            .build()
            .and_then(|writer| writer.write_value_to_vec(value))
            .expect("a value built by chatpipe-schemas matches its schema");
        get_payload(self.schema_id, datum)
    }

    /// The value of bytes written under this id. Bytes of other writers (another
    /// schema version) need the registry: [`crate::registry::EventDecoder`].
    pub fn decode(&self, bytes: &[u8]) -> Result<Value, CodecError> {
        let (id, body) = split_frame(bytes)?;
        if id != self.schema_id {
            return Err(CodecError::UnknownSchemaId {
                found: id,
                expected: self.schema_id,
            });
        }
        Ok(
            apache_avro::reader::datum::GenericDatumReader::builder(&self.schema)
                .build()?
                .read_value(&mut &body[..])?,
        )
    }
}

/// Encodes `ChatEvent`s with the schema registered under one id.
#[derive(Debug, Clone)]
pub struct EventCodec(Framed);

/// Payload branch order in the union of `chat_event.avsc`.
const MESSAGE_NEW: u32 = 0;
const READ_UPDATED: u32 = 1;
const CONVERSATION_CREATED: u32 = 2;
const MEMBER_JOINED: u32 = 3;
const MEMBER_LEFT: u32 = 4;
const MEMBER_ROLE_CHANGED: u32 = 5;
const MESSAGE_EDITED: u32 = 6;
const MESSAGE_DELETED: u32 = 7;
const DELIVERY_UPDATED: u32 = 8;
const REACTION_ADDED: u32 = 9;
const REACTION_REMOVED: u32 = 10;
const THREAD_READ: u32 = 11;

impl EventCodec {
    pub fn new(schema_id: u32) -> Self {
        Self(Framed::new(crate::contract::CHAT_EVENTS.schema, schema_id))
    }

    pub fn schema_id(&self) -> u32 {
        self.0.schema_id()
    }

    /// The framed bytes of one event, as the outbox stores them and the topic carries them.
    pub fn encode(&self, event: &ChatEvent) -> Vec<u8> {
        self.0.encode(to_value(event))
    }

    /// Decodes bytes written with this codec's schema id.
    pub fn decode(&self, bytes: &[u8]) -> Result<ChatEvent, CodecError> {
        from_value(self.0.decode(bytes)?)
    }

    /// The framed bytes of `message` around its seq: the event is `head`, then the
    /// seq as an Avro long, then `tail` (`message.seq` itself is ignored). The send
    /// statement takes the seq under the conversation's lock and splices it in
    /// (`chat_avro_long` in migrations/), so the event is written in the statement
    /// that writes the message.
    pub fn message_new_around_seq(&self, message: MessageNew) -> SeqSplice {
        self.around_long(ChatEvent::MessageNew(message), |event, n| {
            if let ChatEvent::MessageNew(m) = event {
                m.seq = crate::Seq::of(n);
            }
        })
    }

    /// The same for `read.updated` around its watermark (`read.last_read_seq` is
    /// ignored): the direct-mode read statement learns where the watermark landed
    /// (`LEAST(seq, last_seq)`) and splices it in.
    pub fn read_updated_around_watermark(&self, read: ReadUpdated) -> SeqSplice {
        self.around_long(ChatEvent::ReadUpdated(read), |event, n| {
            if let ChatEvent::ReadUpdated(r) = event {
                r.last_read_seq = crate::Watermark::of(n);
            }
        })
    }

    /// `event`'s bytes around the one long field `set` writes.
    fn around_long(&self, mut event: ChatEvent, set: impl Fn(&mut ChatEvent, i64)) -> SeqSplice {
        let mut with = |n| {
            set(&mut event, n);
            self.encode(&event)
        };
        // 1 and 2 are one byte each (zigzag 2 and 4): the one byte that differs.
        let (one, two) = (with(1), with(2));
        let at = one
            .iter()
            .zip(&two)
            .position(|(a, b)| a != b)
            .expect("the field is part of the encoding");
        debug_assert_eq!((one.len(), one[at], two[at]), (two.len(), 2, 4));
        SeqSplice {
            head: one[..at].to_vec(),
            tail: one[at + 1..].to_vec(),
        }
    }

    pub fn schema(&self) -> &Schema {
        self.0.schema()
    }
}

/// A framed event without one long field (a `message.new` without its seq, a
/// `read.updated` without its watermark): see [`EventCodec::message_new_around_seq`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeqSplice {
    pub head: Vec<u8>,
    pub tail: Vec<u8>,
}

/// Splits the Confluent frame into schema id and Avro body.
pub fn split_frame(bytes: &[u8]) -> Result<(u32, &[u8]), CodecError> {
    match bytes {
        [0, a, b, c, d, body @ ..] => Ok((u32::from_be_bytes([*a, *b, *c, *d]), body)),
        [] => Err(CodecError::Framing("empty value".into())),
        [magic, ..] if *magic != 0 => Err(CodecError::Framing(format!(
            "magic byte {magic}, expected 0"
        ))),
        _ => Err(CodecError::Framing(format!(
            "{} bytes, shorter than the 5-byte header",
            bytes.len()
        ))),
    }
}

pub(crate) fn micros(t: &DateTime<Utc>) -> Value {
    Value::TimestampMicros(t.timestamp_micros())
}

pub(crate) fn opt_string(s: &Option<String>) -> Value {
    match s {
        Some(s) => Value::Union(1, Box::new(Value::String(s.clone()))),
        None => Value::Union(0, Box::new(Value::Null)),
    }
}

/// An Avro long of an id, seq or watermark.
pub(crate) fn long(v: impl Into<i64>) -> Value {
    Value::Long(v.into())
}

/// An optional long (`["null", "long"]`) of an id, seq or watermark.
pub(crate) fn opt_long(v: Option<impl Into<i64>>) -> Value {
    match v {
        Some(v) => Value::Union(1, Box::new(Value::Long(v.into()))),
        None => Value::Union(0, Box::new(Value::Null)),
    }
}

/// An array of ids.
fn longs(ids: &[crate::UserId]) -> Value {
    Value::Array(ids.iter().map(|u| long(*u)).collect())
}

/// `mentions`, empty in records written before it (chat_event.avsc v6).
fn mentions(p: &mut Fields) -> Result<Vec<crate::UserId>, CodecError> {
    if p.has("mentions") {
        p.ids("mentions")
    } else {
        Ok(Vec::new())
    }
}

fn reaction(e: &Reaction) -> Value {
    record(vec![
        ("seq", long(e.seq)),
        ("userId", long(e.user_id)),
        ("key", Value::String(e.key.clone())),
        ("count", long(e.count)),
    ])
}

fn reaction_from(
    mut p: Fields,
    conversation_id: ConversationId,
    occurred_at: DateTime<Utc>,
) -> Result<Reaction, CodecError> {
    Ok(Reaction {
        conversation_id,
        seq: p.id("seq")?,
        user_id: p.id("userId")?,
        key: p.string("key")?,
        count: p.long("count")?,
        occurred_at,
    })
}

pub(crate) fn record(fields: Vec<(&str, Value)>) -> Value {
    Value::Record(fields.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
}

/// The Avro value of an event.
pub fn to_value(event: &ChatEvent) -> Value {
    let (occurred_at, branch, payload) = match event {
        ChatEvent::MessageNew(e) => (
            &e.created_at,
            MESSAGE_NEW,
            record(vec![
                ("seq", long(e.seq)),
                ("senderId", long(e.sender_id)),
                ("clientMsgId", Value::Uuid(e.client_msg_id)),
                ("body", Value::String(e.body.clone())),
                ("mentions", longs(&e.mentions)),
                ("threadRootSeq", opt_long(e.thread_root_seq)),
            ]),
        ),
        ChatEvent::ReadUpdated(e) => (
            &e.occurred_at,
            READ_UPDATED,
            record(vec![
                ("userId", long(e.user_id)),
                ("lastReadSeq", long(e.last_read_seq)),
            ]),
        ),
        ChatEvent::ConversationCreated(e) => (
            &e.occurred_at,
            CONVERSATION_CREATED,
            record(vec![
                (
                    "conversationType",
                    Value::String(e.conversation_type.clone()),
                ),
                ("title", opt_string(&e.title)),
                ("createdBy", long(e.created_by)),
            ]),
        ),
        ChatEvent::MemberJoined(e) => (
            &e.occurred_at,
            MEMBER_JOINED,
            record(vec![
                ("userId", long(e.user_id)),
                ("lastReadSeq", long(e.last_read_seq)),
                ("addedBy", long(e.added_by)),
                ("role", Value::String(e.role.as_str().into())),
            ]),
        ),
        ChatEvent::MemberLeft(e) => (
            &e.occurred_at,
            MEMBER_LEFT,
            record(vec![
                ("userId", long(e.user_id)),
                ("removedBy", long(e.removed_by)),
            ]),
        ),
        ChatEvent::MessageEdited(e) => (
            &e.edited_at,
            MESSAGE_EDITED,
            record(vec![
                ("seq", long(e.seq)),
                ("senderId", long(e.sender_id)),
                ("body", Value::String(e.body.clone())),
                ("mentions", longs(&e.mentions)),
            ]),
        ),
        ChatEvent::DeliveryUpdated(e) => (
            &e.occurred_at,
            DELIVERY_UPDATED,
            record(vec![
                ("userId", long(e.user_id)),
                ("lastDeliveredSeq", long(e.last_delivered_seq)),
            ]),
        ),
        ChatEvent::ReactionAdded(e) => (&e.occurred_at, REACTION_ADDED, reaction(e)),
        ChatEvent::ReactionRemoved(e) => (&e.occurred_at, REACTION_REMOVED, reaction(e)),
        ChatEvent::ThreadRead(e) => (
            &e.occurred_at,
            THREAD_READ,
            record(vec![
                ("userId", long(e.user_id)),
                ("rootSeq", long(e.root_seq)),
                ("lastReadReplySeq", long(e.last_read_seq)),
                ("following", Value::Boolean(e.following)),
            ]),
        ),
        ChatEvent::MessageDeleted(e) => (
            &e.deleted_at,
            MESSAGE_DELETED,
            record(vec![
                ("seq", long(e.seq)),
                ("senderId", long(e.sender_id)),
                ("deletedBy", long(e.deleted_by)),
            ]),
        ),
        ChatEvent::MemberRoleChanged(e) => (
            &e.occurred_at,
            MEMBER_ROLE_CHANGED,
            record(vec![
                ("userId", long(e.user_id)),
                ("role", Value::String(e.role.as_str().into())),
                ("changedBy", long(e.changed_by)),
            ]),
        ),
    };
    record(vec![
        ("type", Value::String(event.event_type().to_owned())),
        ("conversationId", long(event.conversation_id())),
        ("occurredAt", micros(occurred_at)),
        ("payload", Value::Union(branch, Box::new(payload))),
    ])
}

/// Fields of a decoded record, looked up by name.
pub(crate) struct Fields(Vec<(String, Value)>);

impl Fields {
    pub(crate) fn of(value: Value, what: &str) -> Result<Self, CodecError> {
        match value {
            Value::Record(fields) => Ok(Self(fields)),
            other => Err(CodecError::Shape(format!(
                "{what} is {other:?}, not a record"
            ))),
        }
    }

    pub(crate) fn take(&mut self, name: &str) -> Result<Value, CodecError> {
        let i = self
            .0
            .iter()
            .position(|(k, _)| k == name)
            .ok_or_else(|| CodecError::Shape(format!("missing field {name}")))?;
        Ok(self.0.swap_remove(i).1)
    }

    /// Whether the record has this field (an older writer's may not).
    pub(crate) fn has(&self, name: &str) -> bool {
        self.0.iter().any(|(k, _)| k == name)
    }

    pub(crate) fn long(&mut self, name: &str) -> Result<i64, CodecError> {
        match self.take(name)? {
            Value::Long(v) => Ok(v),
            Value::Int(v) => Ok(v.into()),
            other => Err(CodecError::Shape(format!(
                "{name} is {other:?}, not a long"
            ))),
        }
    }

    /// A long that must be in the range of `T` (an id, a seq, a watermark): a value
    /// out of range is a shape error, so the record is poison.
    pub(crate) fn id<T>(&mut self, name: &str) -> Result<T, CodecError>
    where
        T: TryFrom<i64>,
        T::Error: std::fmt::Display,
    {
        in_range(name, self.long(name)?)
    }

    /// An optional [`Self::id`].
    pub(crate) fn opt_id<T>(&mut self, name: &str) -> Result<Option<T>, CodecError>
    where
        T: TryFrom<i64>,
        T::Error: std::fmt::Display,
    {
        self.opt_long(name)?.map(|v| in_range(name, v)).transpose()
    }

    /// An array of [`Self::id`]s.
    pub(crate) fn ids<T>(&mut self, name: &str) -> Result<Vec<T>, CodecError>
    where
        T: TryFrom<i64>,
        T::Error: std::fmt::Display,
    {
        self.longs(name)?
            .into_iter()
            .map(|v| in_range(name, v))
            .collect()
    }

    pub(crate) fn string(&mut self, name: &str) -> Result<String, CodecError> {
        match self.take(name)? {
            Value::String(v) => Ok(v),
            other => Err(CodecError::Shape(format!(
                "{name} is {other:?}, not a string"
            ))),
        }
    }

    /// An optional field: absent (an older writer) reads as None.
    pub(crate) fn opt_string(&mut self, name: &str) -> Result<Option<String>, CodecError> {
        if !self.0.iter().any(|(k, _)| k == name) {
            return Ok(None);
        }
        match self.take(name)? {
            Value::Union(_, v) => match *v {
                Value::Null => Ok(None),
                Value::String(s) => Ok(Some(s)),
                other => Err(CodecError::Shape(format!("{name} is {other:?}"))),
            },
            Value::Null => Ok(None),
            Value::String(s) => Ok(Some(s)),
            other => Err(CodecError::Shape(format!("{name} is {other:?}"))),
        }
    }

    /// An optional uuid: absent (an older writer) or null reads as None.
    pub(crate) fn opt_uuid(&mut self, name: &str) -> Result<Option<uuid::Uuid>, CodecError> {
        if !self.0.iter().any(|(k, _)| k == name) {
            return Ok(None);
        }
        let value = match self.take(name)? {
            Value::Union(_, v) => *v,
            v => v,
        };
        match value {
            Value::Null => Ok(None),
            Value::Uuid(v) => Ok(Some(v)),
            Value::String(s) => s
                .parse()
                .map(Some)
                .map_err(|e| CodecError::Shape(format!("{name}: {e}"))),
            other => Err(CodecError::Shape(format!(
                "{name} is {other:?}, not a uuid"
            ))),
        }
    }

    pub(crate) fn uuid(&mut self, name: &str) -> Result<uuid::Uuid, CodecError> {
        match self.take(name)? {
            Value::Uuid(v) => Ok(v),
            Value::String(s) => s
                .parse()
                .map_err(|e| CodecError::Shape(format!("{name}: {e}"))),
            other => Err(CodecError::Shape(format!(
                "{name} is {other:?}, not a uuid"
            ))),
        }
    }

    pub(crate) fn timestamp(&mut self, name: &str) -> Result<DateTime<Utc>, CodecError> {
        let micros = match self.take(name)? {
            Value::TimestampMicros(v) | Value::Long(v) => v,
            other => {
                return Err(CodecError::Shape(format!(
                    "{name} is {other:?}, not a timestamp"
                )))
            }
        };
        DateTime::from_timestamp_micros(micros)
            .ok_or_else(|| CodecError::Shape(format!("{name} out of range")))
    }

    /// An optional long: absent (an older writer) or null reads as None.
    pub(crate) fn opt_long(&mut self, name: &str) -> Result<Option<i64>, CodecError> {
        if !self.0.iter().any(|(k, _)| k == name) {
            return Ok(None);
        }
        match self.take(name)? {
            Value::Union(_, v) => match *v {
                Value::Null => Ok(None),
                Value::Long(v) => Ok(Some(v)),
                other => Err(CodecError::Shape(format!("{name} is {other:?}"))),
            },
            Value::Null => Ok(None),
            Value::Long(v) => Ok(Some(v)),
            other => Err(CodecError::Shape(format!("{name} is {other:?}"))),
        }
    }

    /// An optional boolean: absent (an older writer) or null reads as None.
    pub(crate) fn opt_boolean(&mut self, name: &str) -> Result<Option<bool>, CodecError> {
        if !self.has(name) {
            return Ok(None);
        }
        match self.take(name)? {
            Value::Union(_, v) => match *v {
                Value::Null => Ok(None),
                Value::Boolean(v) => Ok(Some(v)),
                other => Err(CodecError::Shape(format!("{name} is {other:?}"))),
            },
            Value::Null => Ok(None),
            Value::Boolean(v) => Ok(Some(v)),
            other => Err(CodecError::Shape(format!("{name} is {other:?}"))),
        }
    }

    pub(crate) fn boolean(&mut self, name: &str) -> Result<bool, CodecError> {
        match self.take(name)? {
            Value::Boolean(v) => Ok(v),
            other => Err(CodecError::Shape(format!(
                "{name} is {other:?}, not a boolean"
            ))),
        }
    }

    pub(crate) fn longs(&mut self, name: &str) -> Result<Vec<i64>, CodecError> {
        match self.take(name)? {
            Value::Array(items) => items
                .into_iter()
                .map(|v| match v {
                    Value::Long(v) => Ok(v),
                    other => Err(CodecError::Shape(format!("{name} holds {other:?}"))),
                })
                .collect(),
            other => Err(CodecError::Shape(format!(
                "{name} is {other:?}, not an array"
            ))),
        }
    }

    /// Milliseconds since the epoch (timestamp-millis, or a plain long).
    pub(crate) fn millis(&mut self, name: &str) -> Result<i64, CodecError> {
        match self.take(name)? {
            Value::TimestampMillis(v) | Value::Long(v) => Ok(v),
            other => Err(CodecError::Shape(format!(
                "{name} is {other:?}, not millis"
            ))),
        }
    }
}

fn in_range<T>(name: &str, value: i64) -> Result<T, CodecError>
where
    T: TryFrom<i64>,
    T::Error: std::fmt::Display,
{
    T::try_from(value).map_err(|e| CodecError::Shape(format!("{name} {e}")))
}

/// Reads a framed value with the writer schema the caller already holds (looked up by
/// [`split_frame`]'s id, e.g. from a per-consumer cache): no await, for hot loops.
pub fn read_with(writer: &Schema, bytes: &[u8]) -> Result<Value, CodecError> {
    let (_, body) = split_frame(bytes)?;
    Ok(
        apache_avro::reader::datum::GenericDatumReader::builder(writer)
            .build()?
            .read_value(&mut &body[..])?,
    )
}

/// The event of an Avro value (already resolved to our schema).
pub fn from_value(value: Value) -> Result<ChatEvent, CodecError> {
    let mut envelope = Fields::of(value, "ChatEvent")?;
    let event_type = envelope.string("type")?;
    let conversation_id = envelope.id("conversationId")?;
    let occurred_at = envelope.timestamp("occurredAt")?;
    let payload = match envelope.take("payload")? {
        Value::Union(_, v) => *v,
        other => other,
    };
    let mut p = Fields::of(payload, "payload")?;
    Ok(match event_type.as_str() {
        "message.new" => ChatEvent::MessageNew(MessageNew {
            conversation_id,
            seq: p.id("seq")?,
            sender_id: p.id("senderId")?,
            client_msg_id: p.uuid("clientMsgId")?,
            body: p.string("body")?,
            mentions: mentions(&mut p)?,
            // Absent in records written before threads (chat_event.avsc v7).
            thread_root_seq: if p.has("threadRootSeq") {
                p.opt_id("threadRootSeq")?
            } else {
                None
            },
            created_at: occurred_at,
        }),
        "read.updated" => ChatEvent::ReadUpdated(ReadUpdated {
            conversation_id,
            user_id: p.id("userId")?,
            last_read_seq: p.id("lastReadSeq")?,
            occurred_at,
        }),
        "conversation.created" => ChatEvent::ConversationCreated(ConversationCreated {
            conversation_id,
            conversation_type: p.string("conversationType")?,
            title: p.opt_string("title")?,
            created_by: p.id("createdBy")?,
            occurred_at,
        }),
        "member.joined" => ChatEvent::MemberJoined(MemberJoined {
            conversation_id,
            user_id: p.id("userId")?,
            last_read_seq: p.id("lastReadSeq")?,
            added_by: p.id("addedBy")?,
            // Written before roles existed: a member.
            role: match p.opt_string("role")? {
                Some(role) => role.parse().map_err(CodecError::Shape)?,
                None => Role::Member,
            },
            occurred_at,
        }),
        "member.left" => ChatEvent::MemberLeft(MemberLeft {
            conversation_id,
            user_id: p.id("userId")?,
            removed_by: p.id("removedBy")?,
            occurred_at,
        }),
        "message.edited" => ChatEvent::MessageEdited(MessageEdited {
            conversation_id,
            seq: p.id("seq")?,
            sender_id: p.id("senderId")?,
            body: p.string("body")?,
            mentions: mentions(&mut p)?,
            edited_at: occurred_at,
        }),
        "delivery.updated" => ChatEvent::DeliveryUpdated(DeliveryUpdated {
            conversation_id,
            user_id: p.id("userId")?,
            last_delivered_seq: p.id("lastDeliveredSeq")?,
            occurred_at,
        }),
        "reaction.added" => {
            ChatEvent::ReactionAdded(reaction_from(p, conversation_id, occurred_at)?)
        }
        "reaction.removed" => {
            ChatEvent::ReactionRemoved(reaction_from(p, conversation_id, occurred_at)?)
        }
        "thread.read" => ChatEvent::ThreadRead(ThreadRead {
            conversation_id,
            user_id: p.id("userId")?,
            root_seq: p.id("rootSeq")?,
            last_read_seq: p.id("lastReadReplySeq")?,
            following: p.boolean("following")?,
            occurred_at,
        }),
        "message.deleted" => ChatEvent::MessageDeleted(MessageDeleted {
            conversation_id,
            seq: p.id("seq")?,
            sender_id: p.id("senderId")?,
            deleted_by: p.id("deletedBy")?,
            deleted_at: occurred_at,
        }),
        "member.role_changed" => ChatEvent::MemberRoleChanged(MemberRoleChanged {
            conversation_id,
            user_id: p.id("userId")?,
            role: p.string("role")?.parse().map_err(CodecError::Shape)?,
            changed_by: p.id("changedBy")?,
            occurred_at,
        }),
        other => return Err(CodecError::Shape(format!("unknown event type {other:?}"))),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ConversationId, Seq, UserId, Watermark};

    fn at() -> DateTime<Utc> {
        DateTime::from_timestamp_micros(1_764_480_000_123_456).unwrap()
    }

    fn every_event() -> Vec<ChatEvent> {
        vec![
            ChatEvent::MessageNew(MessageNew {
                conversation_id: ConversationId::of(7),
                seq: Seq::of(42),
                sender_id: UserId::of(10),
                client_msg_id: uuid::Uuid::new_v4(),
                body: "Hallo Gruppe 👋".into(),
                mentions: vec![UserId::of(20), UserId::of(21)],
                thread_root_seq: Some(Seq::of(40)),
                created_at: at(),
            }),
            ChatEvent::ReadUpdated(ReadUpdated {
                conversation_id: ConversationId::of(7),
                user_id: UserId::of(20),
                last_read_seq: Watermark::of(41),
                occurred_at: at(),
            }),
            ChatEvent::ConversationCreated(ConversationCreated {
                conversation_id: ConversationId::of(7),
                conversation_type: "GROUP".into(),
                title: Some("Trip".into()),
                created_by: UserId::of(10),
                occurred_at: at(),
            }),
            ChatEvent::ConversationCreated(ConversationCreated {
                conversation_id: ConversationId::of(8),
                conversation_type: "DIRECT".into(),
                title: None,
                created_by: UserId::of(10),
                occurred_at: at(),
            }),
            ChatEvent::MemberJoined(MemberJoined {
                conversation_id: ConversationId::of(7),
                user_id: UserId::of(30),
                last_read_seq: Watermark::of(42),
                added_by: UserId::of(10),
                role: Role::Member,
                occurred_at: at(),
            }),
            ChatEvent::MemberJoined(MemberJoined {
                conversation_id: ConversationId::of(7),
                user_id: UserId::of(10),
                last_read_seq: Watermark::of(0),
                added_by: UserId::of(10),
                role: Role::Admin,
                occurred_at: at(),
            }),
            ChatEvent::MessageEdited(MessageEdited {
                conversation_id: ConversationId::of(7),
                seq: Seq::of(42),
                sender_id: UserId::of(10),
                body: "Hallo Gruppe 👋 (bearbeitet)".into(),
                mentions: vec![UserId::of(21)],
                edited_at: at(),
            }),
            ChatEvent::DeliveryUpdated(DeliveryUpdated {
                conversation_id: ConversationId::of(7),
                user_id: UserId::of(20),
                last_delivered_seq: Watermark::of(43),
                occurred_at: at(),
            }),
            ChatEvent::ReactionAdded(Reaction {
                conversation_id: ConversationId::of(7),
                seq: Seq::of(42),
                user_id: UserId::of(20),
                key: "👍🏽".into(),
                count: 3,
                occurred_at: at(),
            }),
            ChatEvent::ReactionRemoved(Reaction {
                conversation_id: ConversationId::of(7),
                seq: Seq::of(42),
                user_id: UserId::of(21),
                key: "party_parrot".into(),
                count: 0,
                occurred_at: at(),
            }),
            ChatEvent::ThreadRead(ThreadRead {
                conversation_id: ConversationId::of(7),
                user_id: UserId::of(21),
                root_seq: Seq::of(40),
                last_read_seq: Watermark::of(42),
                following: true,
                occurred_at: at(),
            }),
            ChatEvent::MessageDeleted(MessageDeleted {
                conversation_id: ConversationId::of(7),
                seq: Seq::of(42),
                sender_id: UserId::of(10),
                deleted_by: UserId::of(20),
                deleted_at: at(),
            }),
            ChatEvent::MemberRoleChanged(MemberRoleChanged {
                conversation_id: ConversationId::of(7),
                user_id: UserId::of(30),
                role: Role::Admin,
                changed_by: UserId::of(10),
                occurred_at: at(),
            }),
            ChatEvent::MemberLeft(MemberLeft {
                conversation_id: ConversationId::of(7),
                user_id: UserId::of(30),
                removed_by: UserId::of(30),
                occurred_at: at(),
            }),
        ]
    }

    /// An Avro long as the specification writes it: zigzag, then 7-bit groups.
    fn avro_long(n: i64) -> Vec<u8> {
        let mut z = ((n << 1) ^ (n >> 63)) as u64;
        let mut out = Vec::new();
        loop {
            let b = (z & 0x7f) as u8;
            z >>= 7;
            if z == 0 {
                out.push(b);
                return out;
            }
            out.push(b | 0x80);
        }
    }

    #[test]
    fn a_seq_spliced_between_head_and_tail_is_the_event_encoded_with_it() {
        let codec = EventCodec::new(17);
        let ChatEvent::MessageNew(m) = every_event().remove(0) else {
            unreachable!()
        };
        let splice = codec.message_new_around_seq(m.clone());
        for seq in [1, 2, 63, 64, 8191, 8192, 1 << 40, i64::MAX] {
            let mut spliced = splice.head.clone();
            spliced.extend(avro_long(seq));
            spliced.extend(&splice.tail);
            let mut expected = m.clone();
            expected.seq = Seq::of(seq);
            assert_eq!(
                spliced,
                codec.encode(&ChatEvent::MessageNew(expected)),
                "seq {seq}"
            );
        }
    }

    #[test]
    fn a_watermark_spliced_between_head_and_tail_is_the_read_encoded_with_it() {
        let codec = EventCodec::new(17);
        let read = every_event()
            .into_iter()
            .find_map(|e| match e {
                ChatEvent::ReadUpdated(r) => Some(r),
                _ => None,
            })
            .expect("a read.updated among every_event");
        let splice = codec.read_updated_around_watermark(read.clone());
        for n in [0, 1, 2, 63, 64, 8191, 8192, 1 << 40, i64::MAX] {
            let mut spliced = splice.head.clone();
            spliced.extend(avro_long(n));
            spliced.extend(&splice.tail);
            let mut expected = read.clone();
            expected.last_read_seq = crate::Watermark::of(n);
            assert_eq!(
                spliced,
                codec.encode(&ChatEvent::ReadUpdated(expected)),
                "watermark {n}"
            );
        }
    }

    #[test]
    fn every_event_round_trips_through_framed_avro() {
        let codec = EventCodec::new(17);
        for event in every_event() {
            let bytes = codec.encode(&event);
            assert_eq!(
                &bytes[..5],
                &[0, 0, 0, 0, 17],
                "Confluent frame with schema id 17"
            );
            assert_eq!(codec.decode(&bytes).unwrap(), event);
        }
    }

    #[test]
    fn an_id_out_of_range_does_not_decode() {
        let codec = EventCodec::new(1);
        for (field, zero) in [("conversationId", 0), ("conversationId", -4)] {
            let Value::Record(mut fields) = to_value(&every_event()[0]) else {
                unreachable!("events are records")
            };
            for (k, v) in fields.iter_mut() {
                if k == field {
                    *v = Value::Long(zero);
                }
            }
            let err = codec
                .decode(&codec.0.encode(Value::Record(fields)))
                .unwrap_err();
            assert!(
                matches!(&err, CodecError::Shape(m) if m.contains(field)),
                "{field} = {zero}: {err}"
            );
        }
    }

    #[test]
    fn garbage_is_a_clear_error() {
        let codec = EventCodec::new(1);
        assert!(matches!(codec.decode(b""), Err(CodecError::Framing(_))));
        assert!(matches!(
            codec.decode(b"{\"type\":1}"),
            Err(CodecError::Framing(_))
        ));
        assert!(matches!(
            codec.decode(&[0, 0, 0]),
            Err(CodecError::Framing(_))
        ));
        assert!(matches!(
            codec.decode(&[0, 0, 0, 0, 2, 1]),
            Err(CodecError::UnknownSchemaId { found: 2, .. })
        ));
        assert!(codec.decode(&[0, 0, 0, 0, 1, 0xff, 0xff]).is_err());
    }
}
