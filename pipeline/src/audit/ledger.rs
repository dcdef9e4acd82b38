//! What the auditor learns from `chat.events` alone, free of Kafka: per conversation the
//! highest seq seen (gaps and duplicates), per member the highest `read.updated`
//! (watermarks moving backwards).
//!
//! Within a conversation `chat.events` is in seq order: seqs are taken under the
//! conversation's row lock and committed in that order, and Debezium streams commits in
//! order onto one partition. So a seq above `last + 1` is a gap when it is read (nothing
//! can fill it later), and a seq at or below `last` is a duplicate (at-least-once
//! delivery after a Connect restart), which consumers drop by `(conversationId, seq)`.
//!
//! Both tables are bounded LRUs (`audit.max_tracked_conversations`,
//! `audit.max_tracked_members`). A conversation seen for the first time, or again after
//! it was evicted, starts its record at the seq it arrives with: the auditor cannot tell
//! what came before its own start, and says so (`untracked_starts`).

use std::num::NonZeroUsize;

use chatpipe_schemas::{ChatEvent, ConversationId, Seq, UserId, Watermark};
use lru::LruCache;
use serde::Serialize;

/// A hole in a conversation's seqs: `expected` was next, `found` came.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Gap {
    pub conversation_id: ConversationId,
    pub expected: Seq,
    pub found: Seq,
}

impl Gap {
    /// How many seqs are missing.
    pub fn missing(&self) -> i64 {
        self.found.get() - self.expected.get()
    }
}

/// A member's watermark reported lower than an earlier `read.updated`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Regression {
    pub conversation_id: ConversationId,
    pub user_id: UserId,
    pub was: Watermark,
    pub now: Watermark,
}

/// What one event told the ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finding {
    /// As expected (the next seq, a forward read, a membership event).
    Fine,
    /// The first seq of a conversation the ledger was not tracking.
    Untracked,
    Gap(Gap),
    /// `(conversationId, seq)` was seen before.
    Duplicate,
    Regression(Regression),
}

#[derive(Debug)]
pub struct Ledger {
    last_seq: LruCache<ConversationId, Seq>,
    watermarks: LruCache<(ConversationId, UserId), Watermark>,
    newest_created: Option<ConversationId>,
}

impl Ledger {
    pub fn new(max_conversations: usize, max_members: usize) -> Self {
        let cap = |n: usize| NonZeroUsize::new(n).unwrap_or(NonZeroUsize::MIN);
        Self {
            last_seq: LruCache::new(cap(max_conversations)),
            watermarks: LruCache::new(cap(max_members)),
            newest_created: None,
        }
    }

    pub fn observe(&mut self, event: &ChatEvent) -> Finding {
        match event {
            ChatEvent::MessageNew(m) => self.message(m.conversation_id, m.seq),
            ChatEvent::ReadUpdated(r) => self.read(r.conversation_id, r.user_id, r.last_read_seq),
            ChatEvent::ConversationCreated(c) => {
                self.newest_created = self.newest_created.max(Some(c.conversation_id));
                Finding::Fine
            }
            ChatEvent::MemberJoined(_)
            | ChatEvent::MemberLeft(_)
            | ChatEvent::MemberRoleChanged(_)
            | ChatEvent::MessageEdited(_)
            | ChatEvent::MessageDeleted(_)
            | ChatEvent::DeliveryUpdated(_)
            | ChatEvent::ReactionAdded(_)
            | ChatEvent::ReactionRemoved(_)
            | ChatEvent::ThreadRead(_) => Finding::Fine,
        }
    }

    fn message(&mut self, conversation: ConversationId, seq: Seq) -> Finding {
        let Some(last) = self.last_seq.get_mut(&conversation) else {
            self.last_seq.put(conversation, seq);
            // A new conversation's first message is seq 1: nothing was missed.
            return if seq.get() == 1 {
                Finding::Fine
            } else {
                Finding::Untracked
            };
        };
        let expected = last.get() + 1;
        if seq.get() < expected {
            return Finding::Duplicate;
        }
        let previous = *last;
        *last = seq;
        if seq.get() == expected {
            Finding::Fine
        } else {
            Finding::Gap(Gap {
                conversation_id: conversation,
                expected: Seq::of(previous.get() + 1),
                found: seq,
            })
        }
    }

    fn read(&mut self, conversation: ConversationId, user: UserId, now: Watermark) -> Finding {
        let key = (conversation, user);
        match self.watermarks.get_mut(&key) {
            Some(was) if now < *was => Finding::Regression(Regression {
                conversation_id: conversation,
                user_id: user,
                was: *was,
                now,
            }),
            Some(was) => {
                *was = now;
                Finding::Fine
            }
            None => {
                self.watermarks.put(key, now);
                Finding::Fine
            }
        }
    }

    /// The highest seq seen of `conversation`, if it is tracked.
    pub fn last_seq(&self, conversation: ConversationId) -> Option<Seq> {
        self.last_seq.peek(&conversation).copied()
    }

    /// Up to `n` conversations with their highest seq, most recently streamed first.
    pub fn recent(&self, n: usize) -> Vec<(ConversationId, Seq)> {
        self.last_seq
            .iter()
            .take(n)
            .map(|(c, s)| (*c, *s))
            .collect()
    }

    /// The highest conversation id whose `conversation.created` was streamed.
    pub fn newest_created(&self) -> Option<ConversationId> {
        self.newest_created
    }

    pub fn tracked_conversations(&self) -> usize {
        self.last_seq.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chatpipe_schemas::{MessageNew, ReadUpdated};
    use chrono::Utc;

    fn message(c: i64, seq: i64) -> ChatEvent {
        ChatEvent::MessageNew(MessageNew {
            conversation_id: ConversationId::of(c),
            seq: Seq::of(seq),
            sender_id: UserId::of(1),
            client_msg_id: uuid::Uuid::nil(),
            body: "x".into(),
            mentions: Vec::new(),
            thread_root_seq: None,
            created_at: Utc::now(),
        })
    }

    fn read(c: i64, user: i64, seq: i64) -> ChatEvent {
        ChatEvent::ReadUpdated(ReadUpdated {
            conversation_id: ConversationId::of(c),
            user_id: UserId::of(user),
            last_read_seq: Watermark::of(seq),
            occurred_at: Utc::now(),
        })
    }

    #[test]
    fn consecutive_seqs_are_fine_a_hole_is_a_gap_and_a_repeat_a_duplicate() {
        let mut l = Ledger::new(10, 10);
        assert_eq!(l.observe(&message(7, 1)), Finding::Fine);
        assert_eq!(l.observe(&message(7, 2)), Finding::Fine);
        let Finding::Gap(gap) = l.observe(&message(7, 5)) else {
            panic!("3 and 4 are missing")
        };
        assert_eq!(
            (gap.expected, gap.found, gap.missing()),
            (Seq::of(3), Seq::of(5), 2)
        );
        assert_eq!(l.observe(&message(7, 2)), Finding::Duplicate);
        assert_eq!(l.observe(&message(7, 5)), Finding::Duplicate);
        assert_eq!(l.observe(&message(7, 6)), Finding::Fine);
        assert_eq!(l.last_seq(ConversationId::of(7)), Some(Seq::of(6)));
    }

    #[test]
    fn a_conversation_first_seen_mid_history_is_untracked_not_a_gap() {
        let mut l = Ledger::new(1, 10);
        assert_eq!(l.observe(&message(7, 40)), Finding::Untracked);
        assert_eq!(l.observe(&message(7, 41)), Finding::Fine);
        // Evicted by another conversation: its next seq starts a new record.
        assert_eq!(l.observe(&message(8, 1)), Finding::Fine);
        assert_eq!(l.observe(&message(7, 42)), Finding::Untracked);
    }

    #[test]
    fn a_watermark_reported_lower_than_before_is_a_regression() {
        let mut l = Ledger::new(10, 10);
        assert_eq!(l.observe(&read(7, 20, 5)), Finding::Fine);
        assert_eq!(l.observe(&read(7, 20, 5)), Finding::Fine);
        assert_eq!(l.observe(&read(7, 30, 1)), Finding::Fine);
        let Finding::Regression(r) = l.observe(&read(7, 20, 3)) else {
            panic!("5 then 3 moves backwards")
        };
        assert_eq!((r.was, r.now), (Watermark::of(5), Watermark::of(3)));
        assert_eq!(l.observe(&read(7, 20, 9)), Finding::Fine);
    }
}
