//! The analytics topics (`pipeline analytics`): flat records, one type per topic, for SQL
//! engines (docs/topics.md, "Analytics topics"). Timestamps are microseconds since the
//! epoch (`timestamp-micros`).

use apache_avro::types::Value;

use crate::avro::{long, opt_long, opt_string, record, Framed};

/// `change` of an [`AnalyticsMessage`].
pub const CREATED: &str = "created";
pub const EDITED: &str = "edited";
pub const DELETED: &str = "deleted";

/// `change` of an [`AnalyticsMembership`].
pub const JOINED: &str = "joined";
pub const LEFT: &str = "left";
pub const ROLE_CHANGED: &str = "role_changed";

/// One version of one message (`chat.analytics.messages`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnalyticsMessage {
    pub conversation_id: i64,
    pub seq: i64,
    /// [`CREATED`], [`EDITED`] or [`DELETED`].
    pub change: &'static str,
    pub changed_at: i64,
    pub sender_id: i64,
    pub created_at: Option<i64>,
    pub edited_at: Option<i64>,
    pub deleted_at: Option<i64>,
    /// `None` once deleted.
    pub body: Option<String>,
    pub thread_root_seq: Option<i64>,
    pub mentions: Vec<i64>,
}

impl AnalyticsMessage {
    /// The record's key: `conversationId:seq` (one message, compacted to its newest).
    pub fn key(&self) -> String {
        format!("{}:{}", self.conversation_id, self.seq)
    }
}

/// One move of a read or delivered watermark (`chat.analytics.reads`, `.deliveries`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnalyticsWatermark {
    pub conversation_id: i64,
    pub user_id: i64,
    pub from_seq: Option<i64>,
    pub to_seq: i64,
    pub at: i64,
}

/// One change of a conversation's members (`chat.analytics.membership`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnalyticsMembership {
    pub conversation_id: i64,
    pub user_id: i64,
    /// [`JOINED`], [`LEFT`] or [`ROLE_CHANGED`].
    pub change: &'static str,
    pub role: Option<String>,
    pub by: i64,
    pub at: i64,
}

/// Keys of the watermark and membership records: `conversationId:userId`.
pub fn member_key(conversation_id: i64, user_id: i64) -> String {
    format!("{conversation_id}:{user_id}")
}

fn opt_micros(v: Option<i64>) -> Value {
    match v {
        Some(v) => Value::Union(1, Box::new(Value::TimestampMicros(v))),
        None => Value::Union(0, Box::new(Value::Null)),
    }
}

fn opt_int(v: Option<i32>) -> Value {
    match v {
        Some(v) => Value::Union(1, Box::new(Value::Int(v))),
        None => Value::Union(0, Box::new(Value::Null)),
    }
}

/// The encoders of the four topics, each with the id its subject's schema has.
#[derive(Debug, Clone)]
pub struct AnalyticsCodecs {
    pub messages: Framed,
    pub reads: Framed,
    pub deliveries: Framed,
    pub membership: Framed,
}

/// The registered schema ids of the four topics' subjects.
#[derive(Debug, Clone, Copy)]
pub struct AnalyticsIds {
    pub messages: u32,
    pub reads: u32,
    pub deliveries: u32,
    pub membership: u32,
}

impl AnalyticsCodecs {
    pub fn new(ids: AnalyticsIds) -> Self {
        use crate::contract::{ANALYTICS_MEMBERSHIP, ANALYTICS_MESSAGES, ANALYTICS_READS};
        Self {
            messages: Framed::new(ANALYTICS_MESSAGES.schema, ids.messages),
            reads: Framed::new(ANALYTICS_READS.schema, ids.reads),
            deliveries: Framed::new(ANALYTICS_READS.schema, ids.deliveries),
            membership: Framed::new(ANALYTICS_MEMBERSHIP.schema, ids.membership),
        }
    }

    pub fn message(&self, m: &AnalyticsMessage) -> Vec<u8> {
        let length = m
            .body
            .as_ref()
            .map(|b| i32::try_from(b.chars().count()).unwrap_or(i32::MAX));
        self.messages.encode(record(vec![
            ("conversationId", long(m.conversation_id)),
            ("seq", long(m.seq)),
            ("change", Value::String(m.change.into())),
            ("changedAt", Value::TimestampMicros(m.changed_at)),
            ("senderId", long(m.sender_id)),
            ("createdAt", opt_micros(m.created_at)),
            ("editedAt", opt_micros(m.edited_at)),
            ("deletedAt", opt_micros(m.deleted_at)),
            ("bodyLength", opt_int(length)),
            ("body", opt_string(&m.body)),
            ("threadRootSeq", opt_long(m.thread_root_seq)),
            (
                "mentions",
                Value::Array(m.mentions.iter().map(|&u| long(u)).collect()),
            ),
        ]))
    }

    /// A move of a read watermark (`delivered`: of a delivered one).
    pub fn watermark(&self, w: &AnalyticsWatermark, delivered: bool) -> Vec<u8> {
        let codec = if delivered {
            &self.deliveries
        } else {
            &self.reads
        };
        codec.encode(record(vec![
            ("conversationId", long(w.conversation_id)),
            ("userId", long(w.user_id)),
            ("fromSeq", opt_long(w.from_seq)),
            ("toSeq", long(w.to_seq)),
            ("at", Value::TimestampMicros(w.at)),
        ]))
    }

    pub fn membership(&self, m: &AnalyticsMembership) -> Vec<u8> {
        self.membership.encode(record(vec![
            ("conversationId", long(m.conversation_id)),
            ("userId", long(m.user_id)),
            ("change", Value::String(m.change.into())),
            ("role", opt_string(&m.role)),
            ("by", long(m.by)),
            ("at", Value::TimestampMicros(m.at)),
        ]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::avro::read_with;

    fn fields(value: Value) -> Vec<(String, Value)> {
        match value {
            Value::Record(fields) => fields,
            other => panic!("not a record: {other:?}"),
        }
    }

    /// Each encoder writes what its schema reads back, as any Avro reader would.
    #[test]
    fn the_rows_are_their_schemas_records() {
        let codecs = AnalyticsCodecs::new(AnalyticsIds {
            messages: 1,
            reads: 2,
            deliveries: 3,
            membership: 4,
        });
        let deleted = AnalyticsMessage {
            conversation_id: 7,
            seq: 3,
            change: DELETED,
            changed_at: 30,
            sender_id: 2,
            created_at: Some(10),
            edited_at: Some(20),
            deleted_at: Some(30),
            body: None,
            thread_root_seq: Some(1),
            mentions: vec![4],
        };
        let read = fields(read_with(codecs.messages.schema(), &codecs.message(&deleted)).unwrap());
        let get = |name: &str| read.iter().find(|(k, _)| k == name).unwrap().1.clone();
        assert_eq!(get("bodyLength"), Value::Union(0, Box::new(Value::Null)));
        assert_eq!(get("body"), Value::Union(0, Box::new(Value::Null)));
        assert_eq!(get("change"), Value::String("deleted".into()));
        assert_eq!(
            get("createdAt"),
            Value::Union(1, Box::new(Value::TimestampMicros(10)))
        );
        let edited = AnalyticsMessage {
            body: Some("héllo".into()),
            change: EDITED,
            deleted_at: None,
            ..deleted
        };
        let read = fields(read_with(codecs.messages.schema(), &codecs.message(&edited)).unwrap());
        let get = |name: &str| read.iter().find(|(k, _)| k == name).unwrap().1.clone();
        assert_eq!(
            get("bodyLength"),
            Value::Union(1, Box::new(Value::Int(5))),
            "characters, not bytes"
        );
        assert_eq!(edited.key(), "7:3");

        let w = AnalyticsWatermark {
            conversation_id: 7,
            user_id: 2,
            from_seq: None,
            to_seq: 3,
            at: 40,
        };
        let read = fields(read_with(codecs.reads.schema(), &codecs.watermark(&w, false)).unwrap());
        assert_eq!(read[3], ("toSeq".into(), Value::Long(3)));
        let m = AnalyticsMembership {
            conversation_id: 7,
            user_id: 2,
            change: LEFT,
            role: None,
            by: 2,
            at: 50,
        };
        let read = fields(read_with(codecs.membership.schema(), &codecs.membership(&m)).unwrap());
        assert_eq!(read[2], ("change".into(), Value::String("left".into())));
    }
}
