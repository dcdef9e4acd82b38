//! Who is in each conversation, kept current from the membership events of chat.events
//! (conversation.created, member.joined, member.left) rather than a query per event.
//! The table of a partition is rebuilt from that partition's history when the partition
//! is assigned; a conversation whose creation is no longer in the topic (retention) is
//! loaded from PostgreSQL once, then kept current from its events like the others.

use std::collections::{HashMap, HashSet};

use chatpipe_schemas::ChatEvent;

#[derive(Debug, Default)]
pub struct Members {
    conversations: HashMap<i64, Conversation>,
}

#[derive(Debug)]
struct Conversation {
    partition: i32,
    members: HashSet<i64>,
}

impl Members {
    /// Whether the members of `conversation` are known (its creation was seen, or it was
    /// loaded).
    pub fn knows(&self, conversation: i64) -> bool {
        self.conversations.contains_key(&conversation)
    }

    pub fn of(&self, conversation: i64) -> Option<&HashSet<i64>> {
        self.conversations.get(&conversation).map(|c| &c.members)
    }

    /// Installs the members read from the database.
    pub fn load(
        &mut self,
        conversation: i64,
        partition: i32,
        members: impl IntoIterator<Item = i64>,
    ) {
        self.conversations.insert(
            conversation,
            Conversation {
                partition,
                members: members.into_iter().collect(),
            },
        );
    }

    /// Applies a membership event; other events change nothing. Joins and leaves of a
    /// conversation not known are ignored: it is loaded when it is next needed.
    pub fn apply(&mut self, partition: i32, event: &ChatEvent) {
        match event {
            ChatEvent::ConversationCreated(e) => {
                self.conversations
                    .entry(e.conversation_id)
                    .or_insert_with(|| Conversation {
                        partition,
                        members: HashSet::new(),
                    });
            }
            ChatEvent::MemberJoined(e) => {
                if let Some(c) = self.conversations.get_mut(&e.conversation_id) {
                    c.members.insert(e.user_id);
                }
            }
            ChatEvent::MemberLeft(e) => {
                if let Some(c) = self.conversations.get_mut(&e.conversation_id) {
                    c.members.remove(&e.user_id);
                }
            }
            ChatEvent::MessageNew(_) | ChatEvent::ReadUpdated(_) => {}
        }
    }

    /// Forgets the conversations of partitions this member no longer owns.
    pub fn drop_partitions(&mut self, partitions: &[i32]) {
        self.conversations
            .retain(|_, c| !partitions.contains(&c.partition));
    }

    pub fn len(&self) -> usize {
        self.conversations.len()
    }

    pub fn is_empty(&self) -> bool {
        self.conversations.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chatpipe_schemas::{ConversationCreated, MemberJoined, MemberLeft};
    use chrono::Utc;

    fn created(c: i64) -> ChatEvent {
        ChatEvent::ConversationCreated(ConversationCreated {
            conversation_id: c,
            conversation_type: "GROUP".into(),
            title: None,
            created_by: 1,
            occurred_at: Utc::now(),
        })
    }

    fn joined(c: i64, u: i64) -> ChatEvent {
        ChatEvent::MemberJoined(MemberJoined {
            conversation_id: c,
            user_id: u,
            last_read_seq: 0,
            added_by: 1,
            occurred_at: Utc::now(),
        })
    }

    fn left(c: i64, u: i64) -> ChatEvent {
        ChatEvent::MemberLeft(MemberLeft {
            conversation_id: c,
            user_id: u,
            removed_by: u,
            occurred_at: Utc::now(),
        })
    }

    #[test]
    fn membership_follows_the_events_in_order() {
        let mut m = Members::default();
        for e in [
            created(7),
            joined(7, 1),
            joined(7, 2),
            joined(7, 3),
            left(7, 2),
        ] {
            m.apply(0, &e);
        }
        let mut got: Vec<_> = m.of(7).unwrap().iter().copied().collect();
        got.sort();
        assert_eq!(got, vec![1, 3]);
    }

    #[test]
    fn events_of_an_unknown_conversation_do_not_invent_one() {
        let mut m = Members::default();
        m.apply(0, &joined(8, 1));
        assert!(
            !m.knows(8),
            "a join without the creation must be loaded, not guessed"
        );
        m.load(8, 0, [1, 4]);
        m.apply(0, &left(8, 4));
        assert_eq!(m.of(8).unwrap().len(), 1);
    }

    #[test]
    fn revoked_partitions_are_forgotten() {
        let mut m = Members::default();
        m.apply(0, &created(1));
        m.apply(3, &created(2));
        m.drop_partitions(&[3]);
        assert!(m.knows(1) && !m.knows(2));
    }
}
