//! The join itself, free of Kafka: an event, the conversation's members and the presence
//! table in; fanout lists out, one per gateway. Nobody outside `members` is ever on a
//! list (docs/architecture.md, invariant 6), and offline members are on none.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use chatpipe_schemas::delivery::{
    Delivery, DELIVERY_UPDATED, MENTION, MESSAGE_DELETED, MESSAGE_EDITED, MESSAGE_NEW,
    REACTION_ADDED, REACTION_REMOVED, READ_UPDATED, THREAD_READ,
};
use chatpipe_schemas::{
    ChatEvent, ConversationId, DeliveryUpdated, MessageDeleted, MessageEdited, MessageNew,
    Reaction, ReadUpdated, ThreadRead, UserId,
};

pub use super::coalesce::Coalescer;
use super::online::{Gateway, Online};

/// One fanout list and the chat.deliveries partition it goes to.
#[derive(Debug, Clone, PartialEq)]
pub struct Routed {
    pub partition: i32,
    pub delivery: Delivery,
}

/// The fanout lists of one event: (partition, gateway id) -> users.
type Lists = BTreeMap<(i32, Arc<str>), Vec<UserId>>;

/// Splits `users` by the gateways holding them now.
fn by_gateway<'a>(
    users: impl IntoIterator<Item = &'a UserId>,
    online: &Online,
    now_ms: i64,
) -> Lists {
    let mut lists = Lists::new();
    for user in users {
        for Gateway { id, partition } in online.gateways(*user, now_ms) {
            lists
                .entry((*partition, id.clone()))
                .or_default()
                .push(*user);
        }
    }
    for users in lists.values_mut() {
        users.sort_unstable();
    }
    lists
}

/// `template` to those of `users` online now, one list per gateway.
pub fn route_to<'a>(
    users: impl IntoIterator<Item = &'a UserId>,
    online: &Online,
    now_ms: i64,
    template: &Delivery,
) -> Vec<Routed> {
    route(by_gateway(users, online, now_ms), template)
}

fn route(lists: Lists, template: &Delivery) -> Vec<Routed> {
    lists
        .into_iter()
        .map(|((partition, gateway_id), user_ids)| Routed {
            partition,
            delivery: Delivery {
                gateway_id: gateway_id.to_string(),
                user_ids,
                ..template.clone()
            },
        })
        .collect()
}

/// A list of `kind` for `conversation`, committed at `occurred_at` (microseconds), with
/// nothing else filled in.
pub fn template(kind: &str, conversation: ConversationId, occurred_at: i64) -> Delivery {
    Delivery {
        gateway_id: String::new(),
        user_ids: Vec::new(),
        light: false,
        event_type: kind.into(),
        conversation_id: conversation,
        seq: None,
        sender_id: None,
        body: None,
        user_id: None,
        last_read_seq: None,
        last_delivered_seq: None,
        occurred_at,
        client_msg_id: None,
        reaction_key: None,
        reaction_count: None,
        mentions: Vec::new(),
        thread_root_seq: None,
        following: None,
    }
}

/// A message's list to every online member; above `light_threshold` members it carries
/// only `{conversationId, seq}` (the client fetches the message).
fn message_to_members(
    mut full: Delivery,
    members: &HashSet<UserId>,
    online: &Online,
    now_ms: i64,
    light_threshold: usize,
) -> Vec<Routed> {
    if members.len() > light_threshold {
        full = Delivery {
            light: true,
            seq: full.seq,
            thread_root_seq: full.thread_root_seq,
            ..template(&full.event_type, full.conversation_id, full.occurred_at)
        };
    }
    route(by_gateway(members, online, now_ms), &full)
}

/// The lists `event` makes for a conversation of `members`, given who is `online`. In a
/// group larger than `light_threshold`, reads and deliveries are held back in
/// `coalescer` (sent at the next tick), and only the reader hears of a read at once.
pub fn event(
    event: &ChatEvent,
    members: &HashSet<UserId>,
    online: &Online,
    now: i64,
    light_threshold: usize,
    coalescer: &mut Coalescer,
) -> Vec<Routed> {
    match event {
        ChatEvent::MessageNew(e) => message_new(e, members, online, now, light_threshold),
        ChatEvent::ReadUpdated(e) if members.len() > light_threshold => {
            coalescer.add_read(e);
            read_updated_to_reader(e, online, now)
        }
        // Ticks for senders: coalesced in large groups, as reads are; the
        // member's own devices need no word of what they received.
        ChatEvent::DeliveryUpdated(e) if members.len() > light_threshold => {
            coalescer.add_delivery(e);
            Vec::new()
        }
        ChatEvent::DeliveryUpdated(e) => delivery_updated(e, members, online, now),
        ChatEvent::ReadUpdated(e) => read_updated(e, members, online, now),
        ChatEvent::MessageEdited(e) => message_edited(e, members, online, now, light_threshold),
        ChatEvent::MessageDeleted(e) => message_deleted(e, members, online, now, light_threshold),
        ChatEvent::ThreadRead(e) => thread_read(e, members, online, now),
        ChatEvent::ReactionAdded(e) | ChatEvent::ReactionRemoved(e) => {
            let kind = if matches!(event, ChatEvent::ReactionAdded(_)) {
                REACTION_ADDED
            } else {
                REACTION_REMOVED
            };
            if members.len() > light_threshold {
                // The reactor's own devices at once (their "me"); the members coalesced.
                coalescer.add_reaction(kind, e);
                reaction(kind, e, [&e.user_id], online, now)
            } else {
                reaction(kind, e, members, online, now)
            }
        }
        _ => Vec::new(),
    }
}

/// message.new to every online member, the sender's other devices included.
pub fn message_new(
    e: &MessageNew,
    members: &HashSet<UserId>,
    online: &Online,
    now_ms: i64,
    light_threshold: usize,
) -> Vec<Routed> {
    let full = Delivery {
        seq: Some(e.seq),
        sender_id: Some(e.sender_id),
        body: Some(e.body.clone()),
        client_msg_id: Some(e.client_msg_id),
        mentions: e.mentions.clone(),
        thread_root_seq: e.thread_root_seq,
        ..template(
            MESSAGE_NEW,
            e.conversation_id,
            e.created_at.timestamp_micros(),
        )
    };
    let mut lists = Vec::new();
    if members.len() > light_threshold && !e.mentions.is_empty() {
        // The light push says nothing of who is named: the named hear of it at once.
        let mention = Delivery {
            seq: Some(e.seq),
            sender_id: Some(e.sender_id),
            thread_root_seq: e.thread_root_seq,
            ..template(MENTION, e.conversation_id, full.occurred_at)
        };
        let named = e.mentions.iter().filter(|u| members.contains(u));
        lists = route(by_gateway(named, online, now_ms), &mention);
    }
    lists.extend(message_to_members(
        full,
        members,
        online,
        now_ms,
        light_threshold,
    ));
    lists
}

/// message.edited to every online member, as message.new goes, with the new body.
pub fn message_edited(
    e: &MessageEdited,
    members: &HashSet<UserId>,
    online: &Online,
    now_ms: i64,
    light_threshold: usize,
) -> Vec<Routed> {
    let full = Delivery {
        seq: Some(e.seq),
        sender_id: Some(e.sender_id),
        body: Some(e.body.clone()),
        mentions: e.mentions.clone(),
        ..template(
            MESSAGE_EDITED,
            e.conversation_id,
            e.edited_at.timestamp_micros(),
        )
    };
    message_to_members(full, members, online, now_ms, light_threshold)
}

/// message.deleted to every online member: never a body; who sent and who deleted it.
pub fn message_deleted(
    e: &MessageDeleted,
    members: &HashSet<UserId>,
    online: &Online,
    now_ms: i64,
    light_threshold: usize,
) -> Vec<Routed> {
    let full = Delivery {
        seq: Some(e.seq),
        sender_id: Some(e.sender_id),
        user_id: Some(e.deleted_by),
        ..template(
            MESSAGE_DELETED,
            e.conversation_id,
            e.deleted_at.timestamp_micros(),
        )
    };
    message_to_members(full, members, online, now_ms, light_threshold)
}

/// read.updated for a conversation up to `light_threshold` members: to every online
/// member (the reader's other devices, and the others' "Read" marks).
pub fn read_updated(
    e: &ReadUpdated,
    members: &HashSet<UserId>,
    online: &Online,
    now_ms: i64,
) -> Vec<Routed> {
    route(by_gateway(members, online, now_ms), &read_template(e))
}

/// read.updated in a large group, for the reader's own devices only; the members get a
/// coalesced [`Coalescer`] push instead.
pub fn read_updated_to_reader(e: &ReadUpdated, online: &Online, now_ms: i64) -> Vec<Routed> {
    route(by_gateway([&e.user_id], online, now_ms), &read_template(e))
}

/// thread.read to the reader's own devices (a member's place in a thread is theirs).
pub fn thread_read(
    e: &ThreadRead,
    members: &HashSet<UserId>,
    online: &Online,
    now_ms: i64,
) -> Vec<Routed> {
    if !members.contains(&e.user_id) {
        return Vec::new();
    }
    let delivery = Delivery {
        user_id: Some(e.user_id),
        thread_root_seq: Some(e.root_seq),
        last_read_seq: Some(e.last_read_seq),
        following: Some(e.following),
        ..template(
            THREAD_READ,
            e.conversation_id,
            e.occurred_at.timestamp_micros(),
        )
    };
    route(by_gateway([&e.user_id], online, now_ms), &delivery)
}

fn read_template(e: &ReadUpdated) -> Delivery {
    Delivery {
        user_id: Some(e.user_id),
        last_read_seq: Some(e.last_read_seq),
        ..template(
            READ_UPDATED,
            e.conversation_id,
            e.occurred_at.timestamp_micros(),
        )
    }
}

/// delivery.updated for a conversation up to `light_threshold` members: to every online
/// member (the senders' "delivered" ticks).
pub fn delivery_updated(
    e: &DeliveryUpdated,
    members: &HashSet<UserId>,
    online: &Online,
    now_ms: i64,
) -> Vec<Routed> {
    let delivery = Delivery {
        user_id: Some(e.user_id),
        last_delivered_seq: Some(e.last_delivered_seq),
        ..template(
            DELIVERY_UPDATED,
            e.conversation_id,
            e.occurred_at.timestamp_micros(),
        )
    };
    route(by_gateway(members, online, now_ms), &delivery)
}

/// reaction.added or reaction.removed to those of `users` online, with who reacted and
/// the reaction's count once it committed.
pub fn reaction<'a>(
    kind: &str,
    e: &Reaction,
    users: impl IntoIterator<Item = &'a UserId>,
    online: &Online,
    now_ms: i64,
) -> Vec<Routed> {
    let delivery = Delivery {
        seq: Some(e.seq),
        user_id: Some(e.user_id),
        reaction_key: Some(e.key.clone()),
        reaction_count: Some(e.count),
        ..template(kind, e.conversation_id, e.occurred_at.timestamp_micros())
    };
    route(by_gateway(users, online, now_ms), &delivery)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chatpipe_schemas::Seq;
    use chatpipe_schemas::Watermark;
    use chrono::Utc;

    fn users(ids: impl IntoIterator<Item = i64>) -> HashSet<UserId> {
        ids.into_iter().map(UserId::of).collect()
    }

    fn ids(users: &[UserId]) -> Vec<i64> {
        users.iter().map(|u| u.get()).collect()
    }

    fn online(users: &[(i64, &str, i32)]) -> Online {
        let mut o = Online::default();
        for (u, g, p) in users {
            o.upsert(
                UserId::of(*u),
                Gateway {
                    id: Arc::from(*g),
                    partition: *p,
                },
                i64::MAX,
            );
        }
        o
    }

    fn message(conversation: i64, seq: i64) -> MessageNew {
        MessageNew {
            conversation_id: ConversationId::of(conversation),
            seq: Seq::of(seq),
            sender_id: UserId::of(1),
            client_msg_id: uuid::Uuid::new_v4(),
            body: "hello".into(),
            mentions: Vec::new(),
            thread_root_seq: None,
            created_at: Utc::now(),
        }
    }

    #[test]
    fn lists_are_per_gateway_and_hold_only_online_members() {
        let members = users([1, 2, 3, 4]);
        // 5 is online but no member; 4 is a member but offline.
        let o = online(&[(1, "a", 0), (2, "b", 1), (3, "a", 0), (5, "a", 0)]);
        let routed = message_new(&message(9, 3), &members, &o, 0, 200);
        assert_eq!(routed.len(), 2);
        assert_eq!(
            (routed[0].partition, ids(&routed[0].delivery.user_ids)),
            (0, vec![1, 3])
        );
        assert_eq!(
            (routed[1].partition, ids(&routed[1].delivery.user_ids)),
            (1, vec![2])
        );
        assert_eq!(routed[0].delivery.gateway_id, "a");
        assert_eq!(routed[0].delivery.body.as_deref(), Some("hello"));
        assert!(!routed[0].delivery.light);
    }

    #[test]
    fn above_the_threshold_the_payload_is_light() {
        let members = users(1..=201);
        let o = online(&[(7, "a", 0)]);
        let routed = message_new(&message(9, 3), &members, &o, 0, 200);
        let d = &routed[0].delivery;
        assert!(d.light && d.body.is_none() && d.sender_id.is_none());
        assert_eq!(
            (d.conversation_id, d.seq),
            (ConversationId::of(9), Some(Seq::of(3)))
        );
    }

    #[test]
    fn edits_and_deletes_reach_online_members_only_and_deletes_carry_no_body() {
        let members = users([1, 2, 3]);
        let o = online(&[(1, "a", 0), (2, "a", 0), (5, "a", 0)]);
        let edit = MessageEdited {
            conversation_id: ConversationId::of(9),
            seq: Seq::of(3),
            sender_id: UserId::of(1),
            body: "better".into(),
            mentions: Vec::new(),
            edited_at: Utc::now(),
        };
        let routed = message_edited(&edit, &members, &o, 0, 200);
        assert_eq!(routed.len(), 1);
        let d = &routed[0].delivery;
        assert_eq!(
            ids(&d.user_ids),
            vec![1, 2],
            "not 5, no member; not 3, offline"
        );
        assert_eq!(
            (d.event_type.as_str(), d.body.as_deref()),
            (MESSAGE_EDITED, Some("better"))
        );
        let delete = MessageDeleted {
            conversation_id: ConversationId::of(9),
            seq: Seq::of(3),
            sender_id: UserId::of(1),
            deleted_by: UserId::of(2),
            deleted_at: Utc::now(),
        };
        let routed = message_deleted(&delete, &members, &o, 0, 200);
        let d = &routed[0].delivery;
        assert_eq!(ids(&d.user_ids), vec![1, 2]);
        assert_eq!(
            (d.event_type.as_str(), d.seq, d.user_id, d.body.as_deref()),
            (MESSAGE_DELETED, Some(Seq::of(3)), Some(UserId::of(2)), None)
        );
        // Light above the threshold: the seq only.
        let routed = message_edited(&edit, &users(1..=201), &o, 0, 200);
        let d = &routed[0].delivery;
        assert!(d.light && d.body.is_none() && d.sender_id.is_none());
    }

    #[test]
    fn deliveries_go_to_online_members_and_coalesce_apart_from_reads_in_a_large_group() {
        let members = users([1, 2, 3]);
        let o = online(&[(1, "a", 0), (2, "a", 0)]);
        let tick = |user: i64, seq: i64| DeliveryUpdated {
            conversation_id: ConversationId::of(4),
            user_id: UserId::of(user),
            last_delivered_seq: Watermark::of(seq),
            occurred_at: Utc::now(),
        };
        let routed = delivery_updated(&tick(3, 7), &members, &o, 0);
        let d = &routed[0].delivery;
        assert_eq!(ids(&d.user_ids), vec![1, 2]);
        assert_eq!(
            (
                d.event_type.as_str(),
                d.user_id,
                d.last_delivered_seq,
                d.last_read_seq
            ),
            (
                DELIVERY_UPDATED,
                Some(UserId::of(3)),
                Some(Watermark::of(7)),
                None
            )
        );

        // Large group: one light push per conversation and kind, the highest of each.
        let mut c = Coalescer::default();
        for (user, seq) in [(1, 5), (2, 9)] {
            c.add_delivery(&tick(user, seq));
        }
        c.add_read(&ReadUpdated {
            conversation_id: ConversationId::of(4),
            user_id: UserId::of(3),
            last_read_seq: Watermark::of(2),
            occurred_at: Utc::now(),
        });
        let big = users(1..=300);
        let mut routed = c.drain(|_| Some(&big), &o, 0);
        routed.sort_by(|a, b| a.delivery.event_type.cmp(&b.delivery.event_type));
        let got: Vec<_> = routed
            .iter()
            .map(|r| {
                let d = &r.delivery;
                (
                    d.event_type.as_str(),
                    d.light,
                    d.last_delivered_seq,
                    d.last_read_seq,
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                (DELIVERY_UPDATED, true, Some(Watermark::of(9)), None),
                (READ_UPDATED, true, None, Some(Watermark::of(2))),
            ]
        );
    }

    #[test]
    fn reads_in_a_large_group_coalesce_to_the_highest_per_conversation() {
        let members = users(1..=300);
        let o = online(&[(1, "a", 0), (2, "a", 0)]);
        let mut c = Coalescer::default();
        for (user, seq) in [(1, 5), (2, 9), (3, 7)] {
            c.add_read(&ReadUpdated {
                conversation_id: ConversationId::of(4),
                user_id: UserId::of(user),
                last_read_seq: Watermark::of(seq),
                occurred_at: Utc::now(),
            });
        }
        assert_eq!(c.len(), 1);
        let routed = c.drain(|_| Some(&members), &o, 0);
        assert_eq!(routed.len(), 1);
        let d = &routed[0].delivery;
        assert_eq!(
            (d.light, d.last_read_seq, d.user_id),
            (true, Some(Watermark::of(9)), None)
        );
        assert_eq!(ids(&d.user_ids), vec![1, 2]);
        assert!(c.is_empty());
    }

    #[test]
    fn an_event_routes_at_once_in_a_small_group_and_reads_wait_for_the_tick_in_a_large_one() {
        let o = online(&[(1, "a", 0), (2, "b", 1), (3, "a", 0)]);
        let read = |conversation| {
            ChatEvent::ReadUpdated(ReadUpdated {
                conversation_id: ConversationId::of(conversation),
                user_id: UserId::of(3),
                last_read_seq: Watermark::of(2),
                occurred_at: Utc::now(),
            })
        };
        let mut c = Coalescer::default();
        // Small: every online member hears of the read now, nothing is held back.
        let small = users([1, 2, 3]);
        let now = event(&read(4), &small, &o, 0, 200, &mut c);
        let mut heard: Vec<i64> = now.iter().flat_map(|r| ids(&r.delivery.user_ids)).collect();
        heard.sort();
        assert_eq!(heard, vec![1, 2, 3]);
        assert!(c.drain(|_| Some(&small), &o, 0).is_empty());
        // Large: only the reader's own devices now; the others at the tick, once.
        let large = users(1..=300);
        let now = event(&read(5), &large, &o, 0, 200, &mut c);
        let heard: Vec<i64> = now.iter().flat_map(|r| ids(&r.delivery.user_ids)).collect();
        assert_eq!(heard, vec![3]);
        let ticked = c.drain(|_| Some(&large), &o, 0);
        assert!(!ticked.is_empty(), "the held-back read is sent at the tick");
        assert!(ticked
            .iter()
            .all(|r| r.delivery.conversation_id == ConversationId::of(5)));
        assert!(c.drain(|_| Some(&large), &o, 0).is_empty(), "and only once");
        // A message goes out at once whatever the size.
        let m = ChatEvent::MessageNew(message(5, 3));
        assert_eq!(event(&m, &large, &o, 0, 200, &mut c).len(), 2);
    }
}
