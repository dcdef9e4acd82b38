//! What one chat.events record becomes on the analytics topics: no I/O here. An edit's
//! or delete's row lacks what only the message's first version says (`createdAt`,
//! `threadRootSeq`); the processor looks those up in PostgreSQL before the row goes out.

use std::collections::HashMap;

use chatpipe_schemas::analytics::{
    AnalyticsMembership, AnalyticsMessage, AnalyticsWatermark, CREATED, DELETED, EDITED, JOINED,
    LEFT, ROLE_CHANGED,
};
use chatpipe_schemas::ChatEvent;

/// One row for one analytics topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Row {
    Message(AnalyticsMessage),
    Read(AnalyticsWatermark),
    Delivered(AnalyticsWatermark),
    Membership(AnalyticsMembership),
}

impl Row {
    /// A message row that waits for PostgreSQL's `createdAt` and `threadRootSeq`.
    pub fn needs_lookup(&self) -> bool {
        matches!(self, Row::Message(m) if m.change != CREATED)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Kind {
    Read,
    Delivered,
}

/// The last watermark seen per (conversation, member, kind), for `fromSeq`, with the
/// chat.events partition it came from (forgotten when the partition goes). At most
/// `max` entries: past it all are forgotten.
#[derive(Debug)]
pub struct Watermarks {
    last: HashMap<(i64, i64, Kind), (i32, i64)>,
    max: usize,
}

impl Watermarks {
    pub fn new(max: usize) -> Self {
        Self {
            last: HashMap::new(),
            max,
        }
    }

    /// `to` is the new watermark; returns where it was, if known.
    fn moved(&mut self, partition: i32, key: (i64, i64, Kind), to: i64) -> Option<i64> {
        if !self.last.contains_key(&key) && self.last.len() >= self.max {
            metrics::counter!("analytics_watermarks_forgotten_total")
                .increment(self.last.len() as u64);
            self.last.clear();
        }
        let from = self.last.insert(key, (partition, to)).map(|(_, s)| s);
        metrics::gauge!("analytics_watermarks_tracked").set(self.last.len() as f64);
        from
    }

    /// The partitions went to another member: what came from them may be stale.
    pub fn forget(&mut self, partitions: &[i32]) {
        self.last.retain(|_, (p, _)| !partitions.contains(p));
    }
}

/// The rows `event` (read from `partition`) implies.
pub fn of(event: &ChatEvent, partition: i32, watermarks: &mut Watermarks) -> Option<Row> {
    let micros = |t: &chrono::DateTime<chrono::Utc>| t.timestamp_micros();
    let watermark = |kind, conversation: i64, user: i64, to: i64, at, w: &mut Watermarks| {
        let from = w.moved(partition, (conversation, user, kind), to);
        AnalyticsWatermark {
            conversation_id: conversation,
            user_id: user,
            from_seq: from,
            to_seq: to,
            at,
        }
    };
    Some(match event {
        ChatEvent::MessageNew(m) => Row::Message(AnalyticsMessage {
            conversation_id: m.conversation_id.get(),
            seq: m.seq.get(),
            change: CREATED,
            changed_at: micros(&m.created_at),
            sender_id: m.sender_id.get(),
            created_at: Some(micros(&m.created_at)),
            edited_at: None,
            deleted_at: None,
            body: Some(m.body.clone()),
            thread_root_seq: m.thread_root_seq.map(|s| s.get()),
            mentions: m.mentions.iter().map(|u| u.get()).collect(),
        }),
        ChatEvent::MessageEdited(e) => Row::Message(AnalyticsMessage {
            conversation_id: e.conversation_id.get(),
            seq: e.seq.get(),
            change: EDITED,
            changed_at: micros(&e.edited_at),
            sender_id: e.sender_id.get(),
            created_at: None,
            edited_at: Some(micros(&e.edited_at)),
            deleted_at: None,
            body: Some(e.body.clone()),
            thread_root_seq: None,
            mentions: e.mentions.iter().map(|u| u.get()).collect(),
        }),
        ChatEvent::MessageDeleted(d) => Row::Message(AnalyticsMessage {
            conversation_id: d.conversation_id.get(),
            seq: d.seq.get(),
            change: DELETED,
            changed_at: micros(&d.deleted_at),
            sender_id: d.sender_id.get(),
            created_at: None,
            edited_at: None,
            deleted_at: Some(micros(&d.deleted_at)),
            body: None,
            thread_root_seq: None,
            mentions: Vec::new(),
        }),
        ChatEvent::ReadUpdated(r) => Row::Read(watermark(
            Kind::Read,
            r.conversation_id.get(),
            r.user_id.get(),
            r.last_read_seq.get(),
            micros(&r.occurred_at),
            watermarks,
        )),
        ChatEvent::DeliveryUpdated(d) => Row::Delivered(watermark(
            Kind::Delivered,
            d.conversation_id.get(),
            d.user_id.get(),
            d.last_delivered_seq.get(),
            micros(&d.occurred_at),
            watermarks,
        )),
        ChatEvent::MemberJoined(j) => Row::Membership(AnalyticsMembership {
            conversation_id: j.conversation_id.get(),
            user_id: j.user_id.get(),
            change: JOINED,
            role: Some(j.role.as_str().to_owned()),
            by: j.added_by.get(),
            at: micros(&j.occurred_at),
        }),
        ChatEvent::MemberLeft(l) => Row::Membership(AnalyticsMembership {
            conversation_id: l.conversation_id.get(),
            user_id: l.user_id.get(),
            change: LEFT,
            role: None,
            by: l.removed_by.get(),
            at: micros(&l.occurred_at),
        }),
        ChatEvent::MemberRoleChanged(c) => Row::Membership(AnalyticsMembership {
            conversation_id: c.conversation_id.get(),
            user_id: c.user_id.get(),
            change: ROLE_CHANGED,
            role: Some(c.role.as_str().to_owned()),
            by: c.changed_by.get(),
            at: micros(&c.occurred_at),
        }),
        ChatEvent::ConversationCreated(_)
        | ChatEvent::ReactionAdded(_)
        | ChatEvent::ReactionRemoved(_)
        | ChatEvent::ThreadRead(_) => return None,
    })
}
