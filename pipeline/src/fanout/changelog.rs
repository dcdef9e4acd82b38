//! The changelog of fanout's membership store: the compacted topic
//! `chat.fanout-members`, co-partitioned with chat.events (the entry of a conversation
//! lives on the partition of its events). Fanout writes an entry each time it applies a
//! membership change, and a tombstone when the entry can no longer be trusted; offsets
//! of chat.events are committed only after those writes are acknowledged, so the
//! changelog is never behind them. On assignment a partition's entries are read back:
//! the cost follows the live conversations, not the length of chat.events' history.

use std::time::{Duration, Instant};

use anyhow::Context;
use chatpipe_core::kafka::{BaseConsumer, CreateGuarded};
use chatpipe_schemas::members::{FanoutMembers, FanoutMembersCodec};
use chatpipe_schemas::ConversationId;
use rdkafka::consumer::Consumer;
use rdkafka::{Message, Offset, TopicPartitionList};

use super::key_conversation;
use super::members::{Conversation, Members};
use chatpipe_runtime::{Failure, WriterSchemas};

pub struct Changelog {
    pub topic: String,
    pub codec: FanoutMembersCodec,
}

impl Changelog {
    /// The value of `conversation`'s entry now (`None`: a tombstone).
    pub fn value(&self, members: &Members, conversation: ConversationId) -> Option<Vec<u8>> {
        members.entry(conversation).map(|e| {
            let mut users: Vec<_> = e.members.iter().copied().collect();
            users.sort_unstable();
            let mut admins: Vec<_> = e.admins.iter().copied().collect();
            admins.sort_unstable();
            self.codec.encode(&FanoutMembers {
                conversation_id: conversation,
                user_ids: users,
                admin_ids: admins,
                events_offset: e.offset,
                membership_version: e.version,
            })
        })
    }

    /// Reads `partition` of the changelog from its start to its end as of now into
    /// `members`. Returns the records read. An outage is `Retriable` (the caller drops
    /// the partition's entries and restores again); an entry that does not decode is
    /// skipped, so its conversation is loaded from PostgreSQL when needed.
    pub fn restore(
        &self,
        kafka: &chatpipe_core::config::KafkaSettings,
        group: &str,
        partition: i32,
        schemas: &mut WriterSchemas,
        members: &mut Members,
    ) -> Result<u64, Failure> {
        let topic = &self.topic;
        let reader: BaseConsumer = kafka
            .consumer(&format!("{group}-restore"))
            .create_guarded()
            .context("creating the changelog reader")
            .map_err(Failure::Retriable)?;
        let (low, high) = reader
            .fetch_watermarks(topic, partition, Duration::from_secs(10))
            .with_context(|| format!("reading the watermarks of {topic}/{partition}"))
            .map_err(Failure::Retriable)?;
        let mut read = 0u64;
        if high <= low {
            return Ok(read);
        }
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(topic, partition, Offset::Offset(low))?;
        reader.assign(&tpl)?;
        let mut last_progress = Instant::now();
        loop {
            let Some(result) = reader.poll(Duration::from_millis(500)) else {
                if last_progress.elapsed() > Duration::from_secs(60) {
                    return Err(Failure::retriable(anyhow::anyhow!(
                        "restoring {topic}/{partition}: no record for 60 s"
                    )));
                }
                continue;
            };
            let m = result
                .with_context(|| format!("restoring {topic}/{partition}"))
                .map_err(Failure::Retriable)?;
            last_progress = Instant::now();
            read += 1;
            if let Some(conversation) = key_conversation(m.key()) {
                match m.payload() {
                    None => members.forget(conversation),
                    Some(bytes) => {
                        let entry = schemas.of(bytes).and_then(|w| {
                            FanoutMembers::decode_with(w, bytes)
                                .map_err(|e| Failure::poison(e.to_string()))
                        });
                        match entry {
                            Ok(e) => {
                                members.load(
                                    conversation,
                                    Conversation {
                                        partition,
                                        members: e.user_ids.into_iter().collect(),
                                        admins: e.admin_ids.into_iter().collect(),
                                        offset: e.events_offset,
                                        version: e.membership_version,
                                    },
                                );
                            }
                            Err(Failure::Poison(error)) => {
                                tracing::warn!(partition, offset = m.offset(), error, "unreadable changelog entry: loaded from PostgreSQL when needed");
                                members.forget(conversation);
                            }
                            Err(retriable) => return Err(retriable),
                        }
                    }
                }
            }
            if m.offset() + 1 >= high {
                return Ok(read);
            }
        }
    }
}
