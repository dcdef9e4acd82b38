//! `chat.fanout-members`: the changelog of fanout's membership store (one entry per
//! conversation, compacted).

use apache_avro::types::Value;
use apache_avro::Schema;

use crate::avro::{long, opt_long, read_with, record, CodecError, Fields, Framed};
use crate::{ConversationId, UserId};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FanoutMembers {
    pub conversation_id: ConversationId,
    pub user_ids: Vec<UserId>,
    /// The members who are the group's admins.
    pub admin_ids: Vec<UserId>,
    pub events_offset: i64,
    /// PostgreSQL's `conversation.membership_version` this entry reflects (`None`:
    /// written before versions existed, or by a version that did not know it).
    pub membership_version: Option<i64>,
}

#[derive(Debug, Clone)]
pub struct FanoutMembersCodec(Framed);

impl FanoutMembersCodec {
    pub fn new(schema_id: u32) -> Self {
        Self(Framed::new(
            crate::contract::FANOUT_MEMBERS.schema,
            schema_id,
        ))
    }

    pub fn encode(&self, m: &FanoutMembers) -> Vec<u8> {
        self.0.encode(record(vec![
            ("conversationId", long(m.conversation_id)),
            (
                "userIds",
                Value::Array(m.user_ids.iter().map(|u| long(*u)).collect()),
            ),
            ("eventsOffset", Value::Long(m.events_offset)),
            (
                "adminIds",
                Value::Array(m.admin_ids.iter().map(|u| long(*u)).collect()),
            ),
            ("membershipVersion", opt_long(m.membership_version)),
        ]))
    }
}

impl FanoutMembers {
    /// Decodes a framed value written with `writer` (any registered version).
    pub fn decode_with(writer: &Schema, bytes: &[u8]) -> Result<Self, CodecError> {
        let mut f = Fields::of(read_with(writer, bytes)?, "FanoutMembers")?;
        Ok(Self {
            conversation_id: f.id("conversationId")?,
            user_ids: f.ids("userIds")?,
            events_offset: f.long("eventsOffset")?,
            // Written before roles existed: nobody known as admin.
            admin_ids: if f.has("adminIds") {
                f.ids("adminIds")?
            } else {
                Vec::new()
            },
            membership_version: f.opt_long("membershipVersion")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_round_trips() {
        let codec = FanoutMembersCodec::new(7);
        let m = FanoutMembers {
            conversation_id: ConversationId::of(12),
            user_ids: vec![UserId::of(1), UserId::of(5), UserId::of(9)],
            admin_ids: vec![UserId::of(5)],
            events_offset: 40_000,
            membership_version: Some(3),
        };
        let bytes = codec.encode(&m);
        assert_eq!(
            FanoutMembers::decode_with(codec.0.schema(), &bytes).unwrap(),
            m
        );
    }
}
