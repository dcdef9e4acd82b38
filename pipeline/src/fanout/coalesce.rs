//! Large groups' light pushes, coalesced between two ticks of fanout: reads and
//! deliveries per conversation (the highest watermark), reactions per message and key
//! (the count after the last change).

use std::collections::{HashMap, HashSet};

use chatpipe_schemas::delivery::{Delivery, DELIVERY_UPDATED, READ_UPDATED};
use chatpipe_schemas::{
    ConversationId, DeliveryUpdated, Reaction, ReadUpdated, Seq, UserId, Watermark,
};

use super::online::Online;
use super::plan::{route_to, template, Routed};

/// read.updated and delivery.updated in large groups, coalesced per conversation and
/// kind: between two ticks a conversation's reads (or deliveries) become one light push
/// carrying the highest watermark, which tells clients showing "read by N" (or
/// "delivered to N") to refresh it.
///
/// Reactions in large groups, per (conversation, seq, key): the changes between two
/// ticks become one light push with the key's count after the last of them (the
/// events carry counts, not deltas, and arrive in commit order), without who reacted.
#[derive(Debug, Default)]
pub struct Coalescer {
    pending: HashMap<(ConversationId, &'static str), (Watermark, i64)>,
    reactions: HashMap<(ConversationId, Seq, String), (&'static str, i64, i64)>,
}

impl Coalescer {
    pub fn add_read(&mut self, e: &ReadUpdated) {
        self.add(
            e.conversation_id,
            READ_UPDATED,
            e.last_read_seq,
            e.occurred_at,
        );
    }

    pub fn add_delivery(&mut self, e: &DeliveryUpdated) {
        let (c, seq) = (e.conversation_id, e.last_delivered_seq);
        self.add(c, DELIVERY_UPDATED, seq, e.occurred_at);
    }

    fn add(
        &mut self,
        conversation: ConversationId,
        kind: &'static str,
        seq: Watermark,
        at: chrono::DateTime<chrono::Utc>,
    ) {
        let at = at.timestamp_micros();
        let entry = self
            .pending
            .entry((conversation, kind))
            .or_insert((seq, at));
        *entry = (entry.0.max(seq), entry.1.max(at));
    }

    /// A reaction change of `kind` (reaction.added or reaction.removed).
    pub fn add_reaction(&mut self, kind: &'static str, e: &Reaction) {
        let at = e.occurred_at.timestamp_micros();
        self.reactions.insert(
            (e.conversation_id, e.seq, e.key.clone()),
            (kind, e.count, at),
        );
    }

    pub fn len(&self) -> usize {
        self.pending.len() + self.reactions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pending.is_empty() && self.reactions.is_empty()
    }

    /// The light pushes of everything pending, to the online members of each
    /// conversation (`members_of` answers for the conversations still known).
    pub fn drain<'m>(
        &mut self,
        members_of: impl Fn(ConversationId) -> Option<&'m HashSet<UserId>>,
        online: &Online,
        now_ms: i64,
    ) -> Vec<Routed> {
        let mut out = Vec::new();
        for ((conversation_id, kind), (seq, occurred_at)) in self.pending.drain() {
            let Some(members) = members_of(conversation_id) else {
                continue;
            };
            let read = kind == READ_UPDATED;
            let delivery = Delivery {
                light: true,
                last_read_seq: read.then_some(seq),
                last_delivered_seq: (!read).then_some(seq),
                ..template(kind, conversation_id, occurred_at)
            };
            out.extend(route_to(members, online, now_ms, &delivery));
        }
        for ((conversation_id, seq, key), (kind, count, occurred_at)) in self.reactions.drain() {
            let Some(members) = members_of(conversation_id) else {
                continue;
            };
            let delivery = Delivery {
                light: true,
                seq: Some(seq),
                reaction_key: Some(key),
                reaction_count: Some(count),
                ..template(kind, conversation_id, occurred_at)
            };
            out.extend(route_to(members, online, now_ms, &delivery));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use chatpipe_schemas::delivery::{REACTION_ADDED, REACTION_REMOVED};
    use chatpipe_schemas::ChatEvent;
    use chrono::Utc;

    use super::*;
    use crate::fanout::online::Gateway;
    use crate::fanout::plan::event;

    fn reaction(user: i64, key: &str, count: i64) -> Reaction {
        Reaction {
            conversation_id: ConversationId::of(9),
            seq: Seq::of(4),
            user_id: UserId::of(user),
            key: key.into(),
            count,
            occurred_at: Utc::now(),
        }
    }

    #[test]
    fn reactions_in_a_large_group_go_to_the_reactor_at_once_and_coalesce_per_key() {
        let members: HashSet<UserId> = (1..=300).map(UserId::of).collect();
        let mut online = Online::default();
        for user in [1, 2, 3] {
            let gateway = Gateway {
                id: Arc::from("a"),
                partition: 0,
            };
            online.upsert(UserId::of(user), gateway, i64::MAX);
        }
        let mut c = Coalescer::default();
        let changes = [
            ChatEvent::ReactionAdded(reaction(1, "👍", 1)),
            ChatEvent::ReactionAdded(reaction(2, "👍", 2)),
            ChatEvent::ReactionAdded(reaction(2, "🎉", 1)),
            ChatEvent::ReactionRemoved(reaction(1, "👍", 1)),
        ];
        for change in &changes {
            let now = event(change, &members, &online, 0, 200, &mut c);
            let (ChatEvent::ReactionAdded(e) | ChatEvent::ReactionRemoved(e)) = change else {
                unreachable!()
            };
            assert_eq!(now.len(), 1);
            assert_eq!(
                now[0].delivery.user_ids,
                vec![e.user_id],
                "the reactor only"
            );
            assert!(!now[0].delivery.light);
        }
        let mut drained: Vec<_> = c
            .drain(|_| Some(&members), &online, 0)
            .into_iter()
            .map(|r| {
                let d = r.delivery;
                assert!(d.light && d.user_id.is_none() && d.user_ids.len() == 3);
                (
                    d.event_type,
                    d.reaction_key.unwrap(),
                    d.reaction_count.unwrap(),
                )
            })
            .collect();
        drained.sort();
        assert_eq!(
            drained,
            vec![
                (REACTION_ADDED.to_owned(), "🎉".to_owned(), 1),
                (REACTION_REMOVED.to_owned(), "👍".to_owned(), 1),
            ]
        );
        assert!(c.is_empty());
    }
}
