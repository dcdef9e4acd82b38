//! Who is in each conversation: fanout's membership store, Kafka-Streams style.
//!
//! Kept current from the membership events of chat.events (conversation.created,
//! member.joined, member.left, member.role_changed: members and their roles) rather than
//! a query per event, bounded to `fanout.max_cached_conversations` entries and
//! `fanout.max_cached_members` member ids in all (least recently used first out: a few
//! huge groups cost what their members cost, not one slot each), and
//! backed by a compacted changelog topic ([`super::changelog`]) that fanout writes as it
//! applies changes and restores from when a partition is assigned. A conversation that
//! is not in memory is loaded from PostgreSQL when it is next needed.
//!
//! Every entry remembers the chat.events offset of the last event applied to it, so an
//! event replayed after a restart (offsets are committed after the changelog is written,
//! so the changelog can be ahead of them) changes nothing.
//!
//! Every entry also remembers PostgreSQL's membership version it reflects
//! (`conversation.membership_version`, one step per transaction that changes members;
//! every event carries the version its transaction saw as the `membershipVersion`
//! header). An event newer than the entry proves that a membership change never reached
//! this store (its event was lost with the WAL that carried it): [`Members::behind`] says
//! so, and the caller loads the entry from PostgreSQL again.

use std::collections::HashSet;
use std::num::NonZeroUsize;

use chatpipe_schemas::{ChatEvent, ConversationId, Role, UserId};
use lru::LruCache;

#[derive(Debug)]
pub struct Members {
    conversations: LruCache<ConversationId, Conversation>,
    /// Member ids held, over every entry, and their bound.
    ids: usize,
    max_ids: usize,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conversation {
    pub partition: i32,
    pub members: HashSet<UserId>,
    /// The members who are admins of the group.
    pub admins: HashSet<UserId>,
    /// The chat.events offset of the last event applied (-1: none, loaded from
    /// PostgreSQL just before the event at offset + 1).
    pub offset: i64,
    /// PostgreSQL's membership version this entry reflects (`None`: unknown, an entry
    /// restored from a changelog written before versions existed).
    pub version: Option<i64>,
}

/// What applying an event did to the store, for the changelog.
#[derive(Debug, PartialEq, Eq)]
pub enum Change {
    /// The entry of this conversation changed: write it.
    Wrote(ConversationId),
    /// A membership event for a conversation not in memory: the changelog's entry (if
    /// any) is now stale, so tombstone it; the conversation is loaded when needed.
    Unknown(ConversationId),
    /// Nothing to record.
    None,
}

impl Members {
    pub fn new(max_conversations: usize, max_member_ids: usize) -> Self {
        Self {
            conversations: LruCache::new(
                NonZeroUsize::new(max_conversations).unwrap_or(NonZeroUsize::MIN),
            ),
            ids: 0,
            max_ids: max_member_ids,
        }
    }

    /// Member ids held in memory, over every conversation.
    pub fn member_ids(&self) -> usize {
        self.ids
    }

    /// Evicts the least recently used entries until the member ids fit their bound; the
    /// entry `keep` (the one just used) stays even when it alone is over.
    fn fit(&mut self, keep: ConversationId) {
        while self.ids > self.max_ids {
            match self.conversations.peek_lru() {
                Some((&lru, _)) if lru != keep => {
                    self.remove(lru);
                    metrics::counter!("fanout_cache_evictions_total").increment(1);
                }
                _ => break,
            }
        }
        metrics::gauge!("fanout_cached_members").set(self.ids as f64);
    }

    fn remove(&mut self, conversation: ConversationId) {
        if let Some(gone) = self.conversations.pop(&conversation) {
            self.ids -= gone.members.len();
        }
    }

    /// Whether the members of `conversation` are in memory.
    pub fn knows(&self, conversation: ConversationId) -> bool {
        self.conversations.contains(&conversation)
    }

    /// The members, without marking the entry as used.
    pub fn of(&self, conversation: ConversationId) -> Option<&HashSet<UserId>> {
        self.conversations.peek(&conversation).map(|c| &c.members)
    }

    /// The whole entry (for the changelog).
    pub fn entry(&self, conversation: ConversationId) -> Option<&Conversation> {
        self.conversations.peek(&conversation)
    }

    /// Marks the entry as just used (it is the last to be evicted).
    pub fn touch(&mut self, conversation: ConversationId) {
        self.conversations.promote(&conversation);
    }

    /// Installs an entry (loaded from PostgreSQL or restored from the changelog),
    /// evicting the least recently used ones past either bound.
    pub fn load(&mut self, conversation: ConversationId, entry: Conversation) {
        self.ids += entry.members.len();
        if let Some((old, replaced)) = self.conversations.push(conversation, entry) {
            self.ids -= replaced.members.len();
            if old != conversation {
                metrics::counter!("fanout_cache_evictions_total").increment(1);
            }
        }
        self.fit(conversation);
    }

    /// Whether an event of `conversation` stamped with membership `version` proves that
    /// the entry missed a membership change, so it must be loaded from PostgreSQL again.
    ///
    /// A transaction that changes members moves the version one step, and all its
    /// events carry the version after that step; every later event carries at least it.
    /// So a membership event may be one step ahead of the entry (the first of its
    /// transaction) and any other event none. An entry of unknown version is behind any
    /// stamped event. No entry: nothing to be behind (the caller loads it when needed).
    pub fn behind(&self, conversation: ConversationId, version: i64, event: &ChatEvent) -> bool {
        let Some(entry) = self.conversations.peek(&conversation) else {
            return false;
        };
        let Some(known) = entry.version else {
            return true;
        };
        let step = i64::from(is_membership(event));
        version > known.saturating_add(step)
    }

    /// Applies the event read at `offset` of `partition`, stamped with the membership
    /// `version` its transaction saw (if the record carried one); other events change
    /// nothing. Events at or before an entry's offset were applied already and are
    /// skipped, and so are membership events older than the entry's version (it was
    /// loaded from PostgreSQL after them).
    pub fn apply(
        &mut self,
        partition: i32,
        offset: i64,
        event: &ChatEvent,
        version: Option<i64>,
    ) -> Change {
        let conversation = event.conversation_id();
        match event {
            ChatEvent::ConversationCreated(_) => {
                if self.knows(conversation) {
                    return Change::None;
                }
                self.load(
                    conversation,
                    Conversation {
                        partition,
                        members: HashSet::new(),
                        admins: HashSet::new(),
                        offset,
                        version,
                    },
                );
                return Change::Wrote(conversation);
            }
            ChatEvent::MessageNew(_)
            | ChatEvent::ReadUpdated(_)
            | ChatEvent::MessageEdited(_)
            | ChatEvent::MessageDeleted(_)
            | ChatEvent::DeliveryUpdated(_)
            | ChatEvent::ReactionAdded(_)
            | ChatEvent::ReactionRemoved(_)
            | ChatEvent::ThreadRead(_) => return Change::None,
            ChatEvent::MemberJoined(_)
            | ChatEvent::MemberLeft(_)
            | ChatEvent::MemberRoleChanged(_) => {}
        }
        let Some(entry) = self.conversations.get_mut(&conversation) else {
            return Change::Unknown(conversation);
        };
        if offset <= entry.offset {
            return Change::None;
        }
        entry.offset = offset;
        match (version, entry.version) {
            (Some(v), Some(known)) if v < known => return Change::None,
            (Some(v), _) => entry.version = Some(v),
            (None, _) => {}
        }
        match event {
            ChatEvent::MemberJoined(e) => {
                if entry.members.insert(e.user_id) {
                    self.ids += 1;
                }
                entry.admins.remove(&e.user_id);
                if e.role == Role::Admin {
                    entry.admins.insert(e.user_id);
                }
            }
            ChatEvent::MemberLeft(e) => {
                if entry.members.remove(&e.user_id) {
                    self.ids -= 1;
                }
                entry.admins.remove(&e.user_id);
            }
            ChatEvent::MemberRoleChanged(e) => {
                entry.admins.remove(&e.user_id);
                if e.role == Role::Admin && entry.members.contains(&e.user_id) {
                    entry.admins.insert(e.user_id);
                }
            }
            _ => {}
        }
        self.fit(conversation);
        Change::Wrote(conversation)
    }

    /// Forgets one conversation: it is loaded from PostgreSQL when next needed (an event
    /// of it could not be read, so what this store holds may be wrong).
    pub fn forget(&mut self, conversation: ConversationId) {
        self.remove(conversation);
    }

    /// Forgets the conversations of partitions this member no longer owns.
    pub fn drop_partitions(&mut self, partitions: &[i32]) {
        let gone: Vec<ConversationId> = self
            .conversations
            .iter()
            .filter(|(_, c)| partitions.contains(&c.partition))
            .map(|(id, _)| *id)
            .collect();
        for id in gone {
            self.remove(id);
        }
    }

    pub fn len(&self) -> usize {
        self.conversations.len()
    }

    pub fn is_empty(&self) -> bool {
        self.conversations.is_empty()
    }
}

/// Whether the event changes who is in a conversation or their roles.
pub fn is_membership(event: &ChatEvent) -> bool {
    matches!(
        event,
        ChatEvent::ConversationCreated(_)
            | ChatEvent::MemberJoined(_)
            | ChatEvent::MemberLeft(_)
            | ChatEvent::MemberRoleChanged(_)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use chatpipe_schemas::{
        ConversationCreated, MemberJoined, MemberLeft, MemberRoleChanged, Watermark,
    };
    use chrono::Utc;

    fn created(c: i64) -> ChatEvent {
        ChatEvent::ConversationCreated(ConversationCreated {
            conversation_id: ConversationId::of(c),
            conversation_type: "GROUP".into(),
            title: None,
            created_by: UserId::of(1),
            occurred_at: Utc::now(),
        })
    }

    fn joined(c: i64, u: i64) -> ChatEvent {
        joined_as(c, u, Role::Member)
    }

    fn joined_as(c: i64, u: i64, role: Role) -> ChatEvent {
        ChatEvent::MemberJoined(MemberJoined {
            conversation_id: ConversationId::of(c),
            user_id: UserId::of(u),
            last_read_seq: Watermark::ZERO,
            added_by: UserId::of(1),
            role,
            occurred_at: Utc::now(),
        })
    }

    fn role_changed(c: i64, u: i64, role: Role) -> ChatEvent {
        ChatEvent::MemberRoleChanged(MemberRoleChanged {
            conversation_id: ConversationId::of(c),
            user_id: UserId::of(u),
            role,
            changed_by: UserId::of(1),
            occurred_at: Utc::now(),
        })
    }

    fn left(c: i64, u: i64) -> ChatEvent {
        ChatEvent::MemberLeft(MemberLeft {
            conversation_id: ConversationId::of(c),
            user_id: UserId::of(u),
            removed_by: UserId::of(u),
            occurred_at: Utc::now(),
        })
    }

    fn sorted(m: &Members, c: i64) -> Vec<i64> {
        let mut got: Vec<_> = m
            .of(ConversationId::of(c))
            .unwrap()
            .iter()
            .map(|u| u.get())
            .collect();
        got.sort();
        got
    }

    #[test]
    fn membership_follows_the_events_in_order_and_reports_each_change() {
        let mut m = Members::new(10, 1_000);
        let events = [
            created(7),
            joined(7, 1),
            joined(7, 2),
            joined(7, 3),
            left(7, 2),
        ];
        for (offset, e) in events.iter().enumerate() {
            assert_eq!(
                m.apply(0, offset as i64, e, None),
                Change::Wrote(ConversationId::of(7))
            );
        }
        assert_eq!(sorted(&m, 7), vec![1, 3]);
        assert_eq!(m.entry(ConversationId::of(7)).unwrap().offset, 4);
    }

    #[test]
    fn roles_follow_joins_role_changes_and_leaving() {
        let mut m = Members::new(10, 1_000);
        let events = [
            created(7),
            joined_as(7, 1, Role::Admin),
            joined(7, 2),
            joined(7, 3),
            role_changed(7, 2, Role::Admin),
            left(7, 1),
            role_changed(7, 3, Role::Admin),
            role_changed(7, 2, Role::Member),
        ];
        let mut seen = Vec::new();
        for (offset, e) in events.iter().enumerate() {
            m.apply(0, offset as i64, e, None);
            let mut admins: Vec<i64> = m
                .entry(ConversationId::of(7))
                .unwrap()
                .admins
                .iter()
                .map(|u| u.get())
                .collect();
            admins.sort();
            seen.push(admins);
        }
        assert_eq!(
            seen,
            vec![
                vec![],
                vec![1],
                vec![1],
                vec![1],
                vec![1, 2],
                vec![2],
                vec![2, 3],
                vec![3]
            ]
        );
        // A role change for someone who is not a member makes nobody admin.
        m.apply(0, 8, &role_changed(7, 9, Role::Admin), None);
        assert!(!m
            .entry(ConversationId::of(7))
            .unwrap()
            .admins
            .contains(&UserId::of(9)));
    }

    #[test]
    fn replayed_events_change_nothing() {
        let mut m = Members::new(10, 1_000);
        m.apply(0, 10, &created(7), None);
        m.apply(0, 11, &joined(7, 2), None);
        m.apply(0, 12, &left(7, 2), None);
        // A restart replays from an older committed offset: 2 must not come back.
        assert_eq!(m.apply(0, 11, &joined(7, 2), None), Change::None);
        assert!(sorted(&m, 7).is_empty());
    }

    #[test]
    fn events_of_an_unknown_conversation_do_not_invent_one() {
        let mut m = Members::new(10, 1_000);
        assert_eq!(
            m.apply(0, 0, &joined(8, 1), None),
            Change::Unknown(ConversationId::of(8))
        );
        assert!(
            !m.knows(ConversationId::of(8)),
            "a join without the creation must be loaded, not guessed"
        );
        m.load(
            ConversationId::of(8),
            Conversation {
                partition: 0,
                members: [UserId::of(1), UserId::of(4)].into(),
                admins: [UserId::of(1)].into(),
                offset: 0,
                version: None,
            },
        );
        m.apply(0, 1, &left(8, 4), None);
        assert_eq!(sorted(&m, 8), vec![1]);
    }

    #[test]
    fn the_least_recently_used_conversation_goes_first() {
        let mut m = Members::new(2, 1_000);
        m.apply(0, 0, &created(1), None);
        m.apply(0, 1, &created(2), None);
        m.touch(ConversationId::of(1));
        m.apply(0, 2, &created(3), None);
        assert!(
            m.knows(ConversationId::of(1))
                && !m.knows(ConversationId::of(2))
                && m.knows(ConversationId::of(3))
        );
        assert_eq!(m.len(), 2);
    }

    #[test]
    fn member_ids_are_bounded_over_all_conversations_and_the_one_in_use_stays() {
        // Room for 100 conversations, but only 5 member ids.
        let mut m = Members::new(100, 5);
        for (offset, e) in [
            created(1),
            joined(1, 1),
            joined(1, 2),
            created(2),
            joined(2, 3),
        ]
        .iter()
        .enumerate()
        {
            m.apply(0, offset as i64, e, None);
        }
        assert_eq!((m.len(), m.member_ids()), (2, 3));
        // Conversation 3 with 4 members: 7 ids, so the least recently used (1) goes.
        m.load(
            ConversationId::of(3),
            Conversation {
                partition: 0,
                members: (10..14).map(UserId::of).collect(),
                admins: Default::default(),
                offset: 0,
                version: None,
            },
        );
        assert!(!m.knows(ConversationId::of(1)) && m.knows(ConversationId::of(2)));
        assert_eq!(m.member_ids(), 5);
        // A join past the bound evicts the others, never the conversation it joins.
        m.apply(0, 10, &joined(3, 14), None);
        assert!(m.knows(ConversationId::of(3)) && !m.knows(ConversationId::of(2)));
        assert_eq!(m.member_ids(), 5);
        m.apply(0, 11, &joined(3, 15), None);
        assert_eq!(
            (m.len(), m.member_ids()),
            (1, 6),
            "alone over the bound, it stays"
        );
        m.apply(0, 12, &left(3, 15), None);
        m.forget(ConversationId::of(3));
        assert_eq!((m.len(), m.member_ids()), (0, 0));
    }

    fn message(c: i64) -> ChatEvent {
        ChatEvent::ReadUpdated(chatpipe_schemas::ReadUpdated {
            conversation_id: ConversationId::of(c),
            user_id: UserId::of(1),
            last_read_seq: Watermark::ZERO,
            occurred_at: Utc::now(),
        })
    }

    #[test]
    fn an_event_newer_than_the_entry_proves_a_lost_membership_change() {
        let mut m = Members::new(10, 1_000);
        let c = ConversationId::of(7);
        // Made with two members in one transaction: version 1 on all three events.
        m.apply(0, 0, &created(7), Some(1));
        m.apply(0, 1, &joined(7, 1), Some(1));
        m.apply(0, 2, &joined(7, 2), Some(1));
        assert!(!m.behind(c, 1, &message(7)), "same version: nothing missed");
        assert!(
            !m.behind(c, 2, &left(7, 2)),
            "the next transaction's first event"
        );
        assert!(
            m.behind(c, 2, &message(7)),
            "a message after a change never seen"
        );
        assert!(
            m.behind(c, 3, &left(7, 2)),
            "a membership event two steps ahead"
        );
        assert!(!m.behind(c, 0, &message(7)), "older: the entry knows more");
        assert!(!m.behind(ConversationId::of(8), 9, &message(8)), "no entry");
        m.apply(0, 3, &left(7, 2), Some(2));
        assert_eq!(
            (sorted(&m, 7), m.entry(c).unwrap().version),
            (vec![1], Some(2))
        );
    }

    #[test]
    fn an_entry_of_unknown_version_is_behind_any_stamped_event() {
        let mut m = Members::new(10, 1_000);
        m.apply(0, 0, &created(7), None);
        assert!(m.behind(ConversationId::of(7), 0, &message(7)));
    }

    #[test]
    fn membership_events_older_than_a_reloaded_entry_change_nothing() {
        let mut m = Members::new(10, 1_000);
        // Loaded from PostgreSQL at version 5, where 2 had left already (version 4).
        m.load(
            ConversationId::of(7),
            Conversation {
                partition: 0,
                members: [UserId::of(1)].into(),
                admins: Default::default(),
                offset: 9,
                version: Some(5),
            },
        );
        assert_eq!(m.apply(0, 10, &joined(7, 2), Some(3)), Change::None);
        assert_eq!(
            sorted(&m, 7),
            vec![1],
            "the join of version 3 is not applied again"
        );
        m.apply(0, 11, &joined(7, 3), Some(6));
        assert_eq!(sorted(&m, 7), vec![1, 3]);
    }

    #[test]
    fn revoked_partitions_are_forgotten() {
        let mut m = Members::new(10, 1_000);
        m.apply(0, 0, &created(1), None);
        m.apply(3, 0, &created(2), None);
        m.drop_partitions(&[3]);
        assert!(m.knows(ConversationId::of(1)) && !m.knows(ConversationId::of(2)));
    }
}
