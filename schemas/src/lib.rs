//! The `chat.events` contract as Rust types.
//!
//! Every event names its conversation (the Kafka key) and the moment it happened.
//! Consumers dedupe messages by `(conversationId, seq)` and reads by
//! `(conversationId, userId, lastReadSeq)` (docs/architecture.md, invariant 5).
//!
//! On the wire they are Avro (`chat_event.avsc` beside this crate) in the Confluent
//! framing; [`avro`] maps between the two, [`registry`] registers the schemas, and
//! [`contract`] names each topic with its schema. The serde form (camelCase JSON) is
//! what `pipeline tail` prints.

pub mod analytics;
pub mod avro;
pub mod contract;
pub mod delivery;
pub mod ephemeral;
#[cfg(test)]
mod history;
pub mod ids;
pub mod members;
pub mod notification;
pub mod presence;
pub mod receipt;
pub mod registry;

use chrono::{DateTime, Utc};
pub use ids::{ConversationId, Seq, UserId, Watermark};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// The outbox `aggregatetype` of every event here: the router sends it to `chat.events`.
pub const AGGREGATE_TYPE: &str = "conversation";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum ChatEvent {
    #[serde(rename = "conversation.created")]
    ConversationCreated(ConversationCreated),
    #[serde(rename = "member.joined")]
    MemberJoined(MemberJoined),
    #[serde(rename = "member.left")]
    MemberLeft(MemberLeft),
    #[serde(rename = "member.role_changed")]
    MemberRoleChanged(MemberRoleChanged),
    #[serde(rename = "message.new")]
    MessageNew(MessageNew),
    #[serde(rename = "message.edited")]
    MessageEdited(MessageEdited),
    #[serde(rename = "message.deleted")]
    MessageDeleted(MessageDeleted),
    #[serde(rename = "read.updated")]
    ReadUpdated(ReadUpdated),
    #[serde(rename = "delivery.updated")]
    DeliveryUpdated(DeliveryUpdated),
    #[serde(rename = "reaction.added")]
    ReactionAdded(Reaction),
    #[serde(rename = "thread.read")]
    ThreadRead(ThreadRead),
    #[serde(rename = "reaction.removed")]
    ReactionRemoved(Reaction),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConversationCreated {
    pub conversation_id: ConversationId,
    /// `DIRECT` or `GROUP`.
    pub conversation_type: String,
    pub title: Option<String>,
    pub created_by: UserId,
    pub occurred_at: DateTime<Utc>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MemberJoined {
    pub conversation_id: ConversationId,
    pub user_id: UserId,
    /// The conversation's last_seq when the member joined: their starting watermark.
    pub last_read_seq: Watermark,
    pub added_by: UserId,
    /// A group's creator joins as admin; everyone else, and DIRECT members, as members.
    pub role: Role,
    pub occurred_at: DateTime<Utc>,
}

/// A member's role in a group: admins add and remove others and change roles.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "UPPERCASE")]
pub enum Role {
    Admin,
    Member,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Admin => "ADMIN",
            Self::Member => "MEMBER",
        }
    }
}

impl std::str::FromStr for Role {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "ADMIN" => Ok(Self::Admin),
            "MEMBER" => Ok(Self::Member),
            other => Err(format!("role {other:?} is not ADMIN or MEMBER")),
        }
    }
}

/// A member's role changed: an admin promoted or demoted them, or the last admin left
/// and they, the longest-standing member, became admin.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MemberRoleChanged {
    pub conversation_id: ConversationId,
    pub user_id: UserId,
    pub role: Role,
    pub changed_by: UserId,
    pub occurred_at: DateTime<Utc>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MemberLeft {
    pub conversation_id: ConversationId,
    pub user_id: UserId,
    pub removed_by: UserId,
    pub occurred_at: DateTime<Utc>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MessageNew {
    pub conversation_id: ConversationId,
    pub seq: Seq,
    pub sender_id: UserId,
    pub client_msg_id: Uuid,
    pub body: String,
    /// The members the message names, ascending; never the sender.
    #[serde(default)]
    pub mentions: Vec<UserId>,
    /// A reply: its thread's root, a top-level message of the same conversation.
    #[serde(default)]
    pub thread_root_seq: Option<Seq>,
    pub created_at: DateTime<Utc>,
}

/// A message's sender replaced its body; its seq and place stay.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MessageEdited {
    pub conversation_id: ConversationId,
    pub seq: Seq,
    pub sender_id: UserId,
    pub body: String,
    /// The members the message names after the edit, ascending.
    #[serde(default)]
    pub mentions: Vec<UserId>,
    pub edited_at: DateTime<Utc>,
}

/// A message was deleted, by its sender or a group admin: its body is erased, its seq
/// stays taken. Carries no body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MessageDeleted {
    pub conversation_id: ConversationId,
    pub seq: Seq,
    pub sender_id: UserId,
    pub deleted_by: UserId,
    pub deleted_at: DateTime<Utc>,
}

/// A member added (`reaction.added`) or took back (`reaction.removed`) a reaction `key` to
/// message `seq`; `count` is how many members hold that reaction once it committed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Reaction {
    pub conversation_id: ConversationId,
    pub seq: Seq,
    pub user_id: UserId,
    pub key: String,
    pub count: i64,
    pub occurred_at: DateTime<Utc>,
}

/// A member's place in a thread moved, or they followed or stopped following it: their
/// other devices update the thread's unread state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ThreadRead {
    pub conversation_id: ConversationId,
    pub user_id: UserId,
    pub root_seq: Seq,
    pub last_read_seq: Watermark,
    pub following: bool,
    pub occurred_at: DateTime<Utc>,
}

/// A member's delivery watermark moved: everything up to `last_delivered_seq` reached one
/// of their devices.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeliveryUpdated {
    pub conversation_id: ConversationId,
    pub user_id: UserId,
    pub last_delivered_seq: Watermark,
    pub occurred_at: DateTime<Utc>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReadUpdated {
    pub conversation_id: ConversationId,
    pub user_id: UserId,
    pub last_read_seq: Watermark,
    pub occurred_at: DateTime<Utc>,
}

impl ChatEvent {
    /// The event type as it appears in the envelope and in the outbox `type` column.
    pub fn event_type(&self) -> &'static str {
        match self {
            Self::ConversationCreated(_) => "conversation.created",
            Self::MemberJoined(_) => "member.joined",
            Self::MemberLeft(_) => "member.left",
            Self::MemberRoleChanged(_) => "member.role_changed",
            Self::MessageNew(_) => "message.new",
            Self::MessageEdited(_) => "message.edited",
            Self::MessageDeleted(_) => "message.deleted",
            Self::ReadUpdated(_) => "read.updated",
            Self::DeliveryUpdated(_) => "delivery.updated",
            Self::ReactionAdded(_) => "reaction.added",
            Self::ReactionRemoved(_) => "reaction.removed",
            Self::ThreadRead(_) => "thread.read",
        }
    }

    /// The Kafka key: every event of a conversation lands on one partition, in order.
    pub fn conversation_id(&self) -> ConversationId {
        match self {
            Self::ConversationCreated(e) => e.conversation_id,
            Self::MemberJoined(e) => e.conversation_id,
            Self::MemberLeft(e) => e.conversation_id,
            Self::MemberRoleChanged(e) => e.conversation_id,
            Self::MessageNew(e) => e.conversation_id,
            Self::MessageEdited(e) => e.conversation_id,
            Self::MessageDeleted(e) => e.conversation_id,
            Self::ReadUpdated(e) => e.conversation_id,
            Self::DeliveryUpdated(e) => e.conversation_id,
            Self::ReactionAdded(e) | Self::ReactionRemoved(e) => e.conversation_id,
            Self::ThreadRead(e) => e.conversation_id,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelope_carries_type_and_camel_case_fields() {
        let event = ChatEvent::ReadUpdated(ReadUpdated {
            conversation_id: ConversationId::new(7).unwrap(),
            user_id: UserId::new(20).unwrap(),
            last_read_seq: Watermark::new(5).unwrap(),
            occurred_at: DateTime::from_timestamp(1_700_000_000, 0).unwrap(),
        });
        let json = serde_json::to_value(&event).unwrap();
        assert_eq!(json["type"], "read.updated");
        assert_eq!(json["conversationId"], 7);
        assert_eq!(json["lastReadSeq"], 5);
        assert_eq!(event.event_type(), "read.updated");
    }
}
