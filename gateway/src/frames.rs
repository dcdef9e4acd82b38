//! What the gateway sends a client, one type per frame (docs/protocol.md,
//! docs/asyncapi.yaml, where `tests/contracts` checks each against its payload schema).
//! A push is in full, or (above the fanout threshold) "light": only where to look, the
//! client pulls the rest over REST.

use chatpipe_schemas::delivery::{
    Delivery, DELIVERY_UPDATED, MENTION, MESSAGE_DELETED, MESSAGE_EDITED, MESSAGE_NEW,
    REACTION_ADDED, REACTION_REMOVED, READ_UPDATED, THREAD_READ, TYPING,
};
use chatpipe_schemas::{ConversationId, Seq, UserId, Watermark};
use serde::Serialize;

/// A frame for a client, serialized with its `type`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type")]
pub enum Frame {
    #[serde(rename = "message.new")]
    MessageNew(Pushed<MessageNew, LightMessage>),
    #[serde(rename = "message.edited")]
    MessageEdited(Pushed<MessageEdited, LightMessage>),
    #[serde(rename = "message.deleted")]
    MessageDeleted(Pushed<MessageDeleted, LightMessage>),
    #[serde(rename = "read.updated")]
    ReadUpdated(Pushed<ReadUpdated, LightRead>),
    #[serde(rename = "delivery.updated")]
    DeliveryUpdated(Pushed<DeliveryUpdated, LightDelivered>),
    /// A large group's message names this user (its `message.new` was light).
    #[serde(rename = "mention")]
    Mention(MessageRef),
    #[serde(rename = "reaction.added")]
    ReactionAdded(Reaction),
    #[serde(rename = "reaction.removed")]
    ReactionRemoved(Reaction),
    /// The user's place in a thread moved on another device (or they followed or stopped
    /// following it).
    #[serde(rename = "thread.read")]
    ThreadRead(ThreadRead),
    /// Someone else in the conversation is typing: show it until 6 s after the last one.
    #[serde(rename = "typing")]
    Typing(Typing),
    /// Pushes may have been lost while the connection stayed open: catch up over REST.
    #[serde(rename = "resync")]
    Resync { reason: &'static str },
    /// This connection's pushes are live: everything committed from `pushesFrom` on is
    /// pushed. Catch up over REST once, now.
    #[serde(rename = "ready", rename_all = "camelCase")]
    Ready { pushes_from: String },
}

/// A push in full or light.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Pushed<Full, Light> {
    Full(Full),
    Light(Light),
}

/// Which message a full message event is about, and who sent it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MessageRef {
    pub conversation_id: ConversationId,
    pub seq: Option<Seq>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sender_id: Option<UserId>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MessageNew {
    #[serde(flatten)]
    pub message: MessageRef,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub body: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub created_at: Option<String>,
    /// From fanouts that write it (delivery.avsc v5).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_msg_id: Option<uuid::Uuid>,
    /// The members it names; absent if none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub mentions: Vec<UserId>,
    /// A reply: its thread's root; absent for a top-level message.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub thread_root_seq: Option<Seq>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MessageEdited {
    #[serde(flatten)]
    pub message: MessageRef,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub body: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub edited_at: Option<String>,
    /// The members it names after the edit (empty: nobody any more).
    pub mentions: Vec<UserId>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MessageDeleted {
    #[serde(flatten)]
    pub message: MessageRef,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deleted_by: Option<UserId>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deleted_at: Option<String>,
}

/// A message event above the fanout threshold: fetch it with `afterSeq = seq - 1`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LightMessage {
    pub conversation_id: ConversationId,
    pub seq: Option<Seq>,
    pub light: bool,
    /// message.new of a reply: its thread's root.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub thread_root_seq: Option<Seq>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReadUpdated {
    pub conversation_id: ConversationId,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user_id: Option<UserId>,
    pub last_read_seq: Option<Watermark>,
}

/// Large groups: reads coalesced per conversation, without `userId`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LightRead {
    pub conversation_id: ConversationId,
    pub last_read_seq: Option<Watermark>,
    pub light: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeliveryUpdated {
    pub conversation_id: ConversationId,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user_id: Option<UserId>,
    pub last_delivered_seq: Option<Watermark>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LightDelivered {
    pub conversation_id: ConversationId,
    pub last_delivered_seq: Option<Watermark>,
    pub light: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ThreadRead {
    pub conversation_id: ConversationId,
    pub root_seq: Option<Seq>,
    pub last_read_seq: Option<Watermark>,
    pub following: Option<bool>,
}

/// A member added or took back a reaction; `count` is how many hold it now (0: drop it).
/// Large groups: coalesced per message and key between two fanout ticks, without
/// `userId`, `light` (the reactor's own devices get theirs in full at once).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Reaction {
    pub conversation_id: ConversationId,
    pub seq: Option<Seq>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user_id: Option<UserId>,
    pub key: Option<String>,
    pub count: Option<i64>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub light: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Typing {
    pub conversation_id: ConversationId,
    pub user_id: Option<UserId>,
}

impl Frame {
    /// The frame for a fanout list; `None` for an event type this gateway does not know
    /// (a newer fanout's), which it drops.
    pub fn of(d: &Delivery) -> Option<Self> {
        let at = chrono::DateTime::from_timestamp_micros(d.occurred_at)
            .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Micros, true));
        let (conversation_id, seq) = (d.conversation_id, d.seq);
        let message = MessageRef {
            conversation_id,
            seq,
            sender_id: d.sender_id,
        };
        Some(match d.event_type.as_str() {
            MESSAGE_NEW if d.light => Self::MessageNew(light_message(d)),
            MESSAGE_EDITED if d.light => Self::MessageEdited(light_message(d)),
            MESSAGE_DELETED if d.light => Self::MessageDeleted(light_message(d)),
            MESSAGE_NEW => Self::MessageNew(Pushed::Full(MessageNew {
                message,
                body: d.body.clone(),
                created_at: at,
                client_msg_id: d.client_msg_id,
                mentions: d.mentions.clone(),
                thread_root_seq: d.thread_root_seq,
            })),
            MESSAGE_EDITED => Self::MessageEdited(Pushed::Full(MessageEdited {
                message,
                body: d.body.clone(),
                edited_at: at,
                mentions: d.mentions.clone(),
            })),
            MESSAGE_DELETED => Self::MessageDeleted(Pushed::Full(MessageDeleted {
                message,
                deleted_by: d.user_id,
                deleted_at: at,
            })),
            READ_UPDATED if d.light => Self::ReadUpdated(Pushed::Light(LightRead {
                conversation_id,
                last_read_seq: d.last_read_seq,
                light: true,
            })),
            READ_UPDATED => Self::ReadUpdated(Pushed::Full(ReadUpdated {
                conversation_id,
                user_id: d.user_id,
                last_read_seq: d.last_read_seq,
            })),
            DELIVERY_UPDATED if d.light => Self::DeliveryUpdated(Pushed::Light(LightDelivered {
                conversation_id,
                last_delivered_seq: d.last_delivered_seq,
                light: true,
            })),
            DELIVERY_UPDATED => Self::DeliveryUpdated(Pushed::Full(DeliveryUpdated {
                conversation_id,
                user_id: d.user_id,
                last_delivered_seq: d.last_delivered_seq,
            })),
            MENTION => Self::Mention(message),
            REACTION_ADDED => Self::ReactionAdded(reaction(d)),
            REACTION_REMOVED => Self::ReactionRemoved(reaction(d)),
            THREAD_READ => Self::ThreadRead(ThreadRead {
                conversation_id,
                root_seq: d.thread_root_seq,
                last_read_seq: d.last_read_seq,
                following: d.following,
            }),
            TYPING => Self::Typing(Typing {
                conversation_id,
                user_id: d.user_id,
            }),
            _ => return None,
        })
    }

    /// The frame's JSON text, as it goes on the socket.
    pub fn text(&self) -> String {
        serde_json::to_string(self).expect("a frame serializes")
    }

    /// `ready`, from now.
    pub fn ready() -> Self {
        Self::Ready {
            pushes_from: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
        }
    }
}

fn reaction(d: &Delivery) -> Reaction {
    Reaction {
        conversation_id: d.conversation_id,
        seq: d.seq,
        user_id: d.user_id,
        key: d.reaction_key.clone(),
        count: d.reaction_count,
        light: d.light,
    }
}

/// A message event above the fanout threshold, whichever its type.
fn light_message<Full>(d: &Delivery) -> Pushed<Full, LightMessage> {
    Pushed::Light(LightMessage {
        conversation_id: d.conversation_id,
        seq: d.seq,
        light: true,
        // Where a new reply belongs; an edit or delete is found by its seq.
        thread_root_seq: d.thread_root_seq.filter(|_| d.event_type == MESSAGE_NEW),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use chatpipe_schemas::delivery::{MESSAGE_DELETED, MESSAGE_NEW};

    fn list(event_type: &str, light: bool) -> Delivery {
        Delivery {
            gateway_id: "gw-0".into(),
            user_ids: vec![UserId::of(7)],
            light,
            event_type: event_type.into(),
            conversation_id: ConversationId::of(38),
            seq: Some(Seq::of(4)),
            sender_id: Some(UserId::of(95601)),
            body: Some("See you!".into()),
            user_id: Some(UserId::of(7)),
            last_read_seq: None,
            last_delivered_seq: None,
            occurred_at: 1_796_000_000_000_000,
            client_msg_id: None,
            reaction_key: Some("👍".into()),
            reaction_count: Some(2),
            mentions: Vec::new(),
            thread_root_seq: None,
            following: None,
        }
    }

    #[test]
    fn message_frames_read_as_docs_protocol_shows_them() {
        let text = |t, light| Frame::of(&list(t, light)).unwrap().text();
        assert_eq!(
            text(MESSAGE_NEW, false),
            r#"{"type":"message.new","conversationId":38,"seq":4,"senderId":95601,"body":"See you!","createdAt":"2026-11-30T00:53:20.000000Z"}"#
        );
        assert_eq!(
            text(MESSAGE_DELETED, false),
            r#"{"type":"message.deleted","conversationId":38,"seq":4,"senderId":95601,"deletedBy":7,"deletedAt":"2026-11-30T00:53:20.000000Z"}"#
        );
        assert_eq!(
            text(MESSAGE_NEW, true),
            r#"{"type":"message.new","conversationId":38,"seq":4,"light":true}"#
        );
        assert_eq!(
            text(REACTION_ADDED, false),
            r#"{"type":"reaction.added","conversationId":38,"seq":4,"userId":7,"key":"👍","count":2}"#
        );
    }
}
