//! The fanout processor proper: each chat.events record joined with the conversation's
//! members and the presence table, produced as one fanout list per gateway.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use chatpipe_schemas::delivery::DeliveryCodec;
use chatpipe_schemas::{ChatEvent, ConversationId, UserId};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, Producer, ThreadedProducer};
use sqlx::PgPool;
use tokio::runtime::Handle;

use super::changelog::Changelog;
use super::commits::{ChangelogWrite, ChangelogWrites, DeliveryReport, Unacked};
use super::members::{Change, Conversation};
use super::plan::{self, Routed};
use super::state::State;
use super::{key_conversation, now_ms, Status, Versioned};
use crate::settings::FanoutSettings;
use chatpipe_runtime::{Failure, Position, Processor, WriterSchemas};

/// The fanout processor: its [`Outputs`] (every effect) and its [`State`] (what it
/// keeps between records, no I/O).
pub struct Fanout {
    out: Outputs,
    cfg: FanoutSettings,
    state: State,
}

/// Where fanout's effects go: the database it loads members from, the producer of its
/// lists and changelog entries, the registry it restores with, and what it reports.
pub struct Outputs {
    pub handle: Handle,
    /// For restores (the reader decodes the live records with its own).
    pub schemas: WriterSchemas,
    pub pool: PgPool,
    pub codec: DeliveryCodec,
    pub producer: ThreadedProducer<DeliveryReport>,
    /// Lists and changelog entries produced and not yet acknowledged (shared with the
    /// delivery reports).
    pub unacked: Arc<Unacked>,
    pub status: Arc<Status>,
    pub kafka: chatpipe_core::config::KafkaSettings,
    pub changelog: Changelog,
    /// Changelog writes in flight and refused (shared with the delivery reports).
    pub changelog_writes: Arc<ChangelogWrites>,
}

impl Fanout {
    pub fn new(out: Outputs, cfg: FanoutSettings) -> Self {
        let state = State::new(&cfg);
        Self { out, cfg, state }
    }
}

impl Processor for Fanout {
    type Record = Versioned;

    fn apply(&mut self, at: Position, record: Versioned) -> Result<(), Failure> {
        if !self.state.restored.contains(&at.partition) {
            // A partition new to this member: first the presence its previous owner
            // had applied (a gateway's `ready` may count on it), once for all the
            // partitions of the assignment, then its members.
            if self.state.presence_due {
                super::presence::catch_up_now(
                    &self.out.status,
                    &self.out.kafka,
                    &self.cfg.presence_topic,
                    Duration::from_secs(1),
                )?;
                self.state.presence_due = false;
            }
            self.restore(at.partition)?;
        }
        self.check_version(at, &record)?;
        // An event in a trace (a traced send): a span of its own, continued from the
        // writer's, whose context its lists carry on to the gateways.
        let span = record.traceparent.as_deref().map(|parent| {
            let span = tracing::info_span!(
                "fanout",
                event_type = record.event.event_type(),
                conversation_id = %record.event.conversation_id(),
                partition = at.partition,
                offset = at.offset,
            );
            chatpipe_core::telemetry::continue_trace(&span, parent);
            span
        });
        let _entered = span.as_ref().map(tracing::Span::enter);
        let onward = span
            .as_ref()
            .and_then(chatpipe_core::telemetry::traceparent);
        self.fan_out(
            at,
            &record.event,
            record.membership_version,
            onward.as_deref(),
        )?;
        self.state.offsets.read(at.partition, at.offset);
        self.out.status.events.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// An event that cannot be read may have changed membership: its conversation is
    /// forgotten (here and in the changelog) and loaded from PostgreSQL when next needed.
    fn skip(&mut self, at: Position, key: Option<&[u8]>) {
        if let Some(conversation) = key_conversation(key) {
            self.state.members.forget(conversation);
            self.state.mark_dirty(at.partition, conversation);
        }
        self.state.offsets.read(at.partition, at.offset);
    }

    fn tick(&mut self) -> Result<(), Failure> {
        if Instant::now() < self.state.next_tick {
            return Ok(());
        }
        self.state.next_tick = Instant::now() + Duration::from_millis(self.cfg.tick_ms);
        self.write_dirty()?;
        let now = now_ms();
        let routed = {
            let online = self.out.status.online.lock().expect("presence lock");
            let members = &self.state.members;
            self.state.coalescer.drain(|c| members.of(c), &online, now)
        };
        for r in routed {
            if let Err(err) = self.send(r, None) {
                tracing::warn!("coalesced read: {err:#}");
            }
        }
        let (online, gone) = {
            let mut table = self.out.status.online.lock().expect("presence lock");
            let gone = table.forget(now - self.cfg.presence_forget_ms as i64);
            (table.online_users(now), gone)
        };
        metrics::gauge!("fanout_presence_online").set(online as f64);
        self.tombstone(&gone);
        self.state.offsets.snapshot(self.state.sent);
        Ok(())
    }

    fn committable(&mut self) -> Vec<(i32, i64)> {
        let (oldest, waiting) = self.out.unacked.oldest();
        metrics::gauge!("fanout_unacked_lists").set(waiting as f64);
        self.state.release(oldest);
        std::mem::take(&mut self.state.released)
            .into_iter()
            .collect()
    }

    /// The lists already produced are acknowledged first, so the revoked partitions'
    /// offsets are released and committed with the revoke: the next owner starts after
    /// what was pushed instead of pushing it again. If the broker does not acknowledge
    /// within the flush wait, those records are read (and pushed) again.
    fn assigned(&mut self, partitions: &[i32]) {
        self.out.status.joined(partitions);
        self.state.presence_due = true;
    }

    fn revoke(&mut self, partitions: &[i32]) {
        self.out.status.left(partitions);
        if let Err(err) = self.write_dirty() {
            // Their entries are not written: release no offset, so the next owner
            // reads those events again (from the last commit) and writes them.
            tracing::warn!(
                ?partitions,
                "changelog entries not written ({err:?}): offsets kept back"
            );
            self.state.forget(partitions);
            return;
        }
        if let Err(err) = self.acknowledge_produced() {
            tracing::warn!(
                ?partitions,
                "{err:#}: the next owner pushes their last records again"
            );
        }
        let (oldest, _) = self.out.unacked.oldest();
        self.state.release(oldest);
        self.state.forget(partitions);
    }

    /// What was fanned out is acknowledged before the final commit.
    fn finish(&mut self) -> Result<(), Failure> {
        self.write_dirty()?;
        self.acknowledge_produced().map_err(Failure::Retriable)
    }
}

/// How long a revoke or a stop waits for the broker to acknowledge the lists produced.
const FLUSH_WAIT: Duration = Duration::from_secs(10);

impl Fanout {
    /// Closes the offsets read so far into a snapshot and waits (up to [`FLUSH_WAIT`])
    /// until every list produced is acknowledged, which releases the snapshot.
    fn acknowledge_produced(&mut self) -> anyhow::Result<()> {
        self.state.offsets.snapshot(self.state.sent);
        self.out
            .producer
            .flush(FLUSH_WAIT)
            .context("flushing fanout lists")
    }

    /// Restores the membership of `partition`'s conversations from the changelog.
    fn restore(&mut self, partition: i32) -> Result<(), Failure> {
        let started = Instant::now();
        // A failed attempt may have loaded part of it: start clean.
        self.state.members.drop_partitions(&[partition]);
        let read = self.out.changelog.restore(
            &self.out.kafka,
            &self.cfg.group,
            partition,
            &mut self.out.schemas,
            &mut self.state.members,
        )?;
        self.state.restored.insert(partition);
        metrics::counter!("fanout_restored_records_total").increment(read);
        self.out
            .status
            .restored_records
            .fetch_add(read, Ordering::Relaxed);
        metrics::gauge!("fanout_conversations").set(self.state.members.len() as f64);
        tracing::info!(
            partition,
            read,
            conversations = self.state.members.len(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "membership restored from the changelog"
        );
        Ok(())
    }

    /// Writes every entry changed since the last call, once each. On a failure the
    /// entries not written stay marked.
    fn write_dirty(&mut self) -> Result<(), Failure> {
        for w in self.out.changelog_writes.take_refused() {
            if !self.state.restored.contains(&w.partition) {
                // Given away since: the next owner writes its entries. Its offsets were
                // held back by these numbers and are forgotten; release the numbers.
                w.covers.iter().for_each(|&n| self.out.unacked.done(n));
                continue;
            }
            self.state
                .covers
                .entry(w.conversation)
                .or_default()
                .extend(w.covers);
            self.state.dirty.insert(w.conversation, w.partition);
        }
        let dirty: Vec<(ConversationId, i32)> = self.state.dirty.drain().collect();
        for (i, &(conversation, partition)) in dirty.iter().enumerate() {
            if let Err(err) = self.write_changelog(partition, conversation) {
                self.state.dirty.extend(dirty[i..].iter().copied());
                return Err(err);
            }
        }
        Ok(())
    }

    /// Writes the changelog entry of `conversation` as the store holds it now (a
    /// tombstone if it holds nothing), on `partition`; offsets wait for its ack.
    fn write_changelog(
        &mut self,
        partition: i32,
        conversation: ConversationId,
    ) -> Result<(), Failure> {
        let value = self.out.changelog.value(&self.state.members, conversation);
        let key = conversation.to_string();
        let n = self.state.number();
        self.out.unacked.add(n);
        let covers = self.state.covers.remove(&conversation).unwrap_or_default();
        self.out.changelog_writes.sent(
            n,
            ChangelogWrite {
                conversation,
                partition,
                covers,
            },
        );
        let mut record = BaseRecord::with_opaque_to(&self.out.changelog.topic, n as usize)
            .partition(partition)
            .key(&key);
        if let Some(value) = &value {
            record = record.payload(value);
        }
        if let Err(err) = self.produce(record, n) {
            if let Some(w) = self.out.changelog_writes.unsent(n) {
                self.state
                    .covers
                    .entry(conversation)
                    .or_default()
                    .extend(w.covers);
            }
            return Err(err);
        }
        metrics::counter!("fanout_changelog_writes_total").increment(1);
        Ok(())
    }

    /// An event newer than the cached member list proves a membership change the store
    /// never saw (its event was lost): the list is loaded from PostgreSQL again, and its
    /// changelog entry rewritten, before the event is applied.
    fn check_version(&mut self, at: Position, record: &Versioned) -> Result<(), Failure> {
        let conversation = record.event.conversation_id();
        let Some(version) = record.membership_version else {
            return Ok(());
        };
        if !self
            .state
            .members
            .behind(conversation, version, &record.event)
        {
            return Ok(());
        }
        let had = self
            .state
            .members
            .entry(conversation)
            .and_then(|e| e.version);
        tracing::warn!(
            %conversation,
            cached_version = ?had,
            event_version = version,
            offset = at.offset,
            "membership changed without an event fanout saw: loading the members again"
        );
        metrics::counter!("fanout_membership_version_reloads_total").increment(1);
        self.load_members(conversation, at)?;
        self.state.mark_dirty(at.partition, conversation);
        Ok(())
    }

    fn fan_out(
        &mut self,
        at: Position,
        event: &ChatEvent,
        version: Option<i64>,
        trace: Option<&str>,
    ) -> Result<(), Failure> {
        metrics::counter!("fanout_events_total", "type" => event.event_type()).increment(1);
        let conversation = event.conversation_id();
        match event {
            // A membership change is applied to what is in memory; one for a
            // conversation that is not makes the changelog's entry stale (tombstoned).
            ChatEvent::ConversationCreated(_)
            | ChatEvent::MemberJoined(_)
            | ChatEvent::MemberLeft(_)
            | ChatEvent::MemberRoleChanged(_) => {
                match self
                    .state
                    .members
                    .apply(at.partition, at.offset, event, version)
                {
                    Change::Wrote(c) | Change::Unknown(c) => self.state.mark_dirty(at.partition, c),
                    Change::None => {}
                }
                return Ok(());
            }
            ChatEvent::MessageNew(_)
            | ChatEvent::ReadUpdated(_)
            | ChatEvent::MessageEdited(_)
            | ChatEvent::MessageDeleted(_)
            | ChatEvent::DeliveryUpdated(_)
            | ChatEvent::ReactionAdded(_)
            | ChatEvent::ReactionRemoved(_)
            | ChatEvent::ThreadRead(_) => {
                if self.state.members.knows(conversation) {
                    self.state.members.touch(conversation);
                } else {
                    self.load_members(conversation, at)?;
                }
            }
        }
        let occurred_at = match event {
            ChatEvent::MessageNew(e) => e.created_at,
            ChatEvent::ReadUpdated(e) => e.occurred_at,
            ChatEvent::MessageEdited(e) => e.edited_at,
            ChatEvent::MessageDeleted(e) => e.deleted_at,
            ChatEvent::DeliveryUpdated(e) => e.occurred_at,
            ChatEvent::ReactionAdded(e) | ChatEvent::ReactionRemoved(e) => e.occurred_at,
            ChatEvent::ThreadRead(e) => e.occurred_at,
            _ => return Ok(()),
        };
        let age = chrono::Utc::now() - occurred_at;
        metrics::histogram!("fanout_event_age_seconds")
            .record(age.num_microseconds().unwrap_or(i64::MAX).max(0) as f64 / 1e6);
        if age.num_milliseconds() > self.cfg.max_age_ms as i64 {
            metrics::counter!("fanout_stale_skipped_total").increment(1);
            return Ok(());
        }
        let Some(members) = self.state.members.of(conversation) else {
            return Ok(());
        };
        let now = now_ms();
        let routed = {
            let online = self.out.status.online.lock().expect("presence lock");
            let light = self.cfg.light_threshold;
            plan::event(
                event,
                members,
                &online,
                now,
                light,
                &mut self.state.coalescer,
            )
        };
        for r in routed {
            self.send(r, trace)?;
        }
        Ok(())
    }

    /// The members of a conversation not in memory (evicted, never seen, or one of its
    /// events could not be read) or behind its events' version: from PostgreSQL, then
    /// kept from its events.
    fn load_members(&mut self, conversation: ConversationId, at: Position) -> Result<(), Failure> {
        // One statement, one snapshot: the members and the version they are at.
        let rows: Vec<(i64, Option<i64>, Option<bool>)> = self
            .out
            .handle
            .block_on(
                sqlx::query_as(
                    "SELECT c.membership_version, m.user_id, m.role = 'ADMIN'
                       FROM conversation c
                       LEFT JOIN conversation_member m ON m.conversation_id = c.id
                      WHERE c.id = $1",
                )
                .bind(conversation.get())
                .fetch_all(&self.out.pool),
            )
            .with_context(|| format!("loading the members of conversation {conversation}"))
            .map_err(Failure::Retriable)?;
        metrics::counter!("fanout_membership_loads_total").increment(1);
        self.out
            .status
            .membership_loads
            .fetch_add(1, Ordering::Relaxed);
        let id = |u: i64| {
            chatpipe_core::db::id(u).map_err(|e| Failure::retriable(anyhow::Error::from(e)))
        };
        let mut members = HashSet::new();
        let mut admins = HashSet::new();
        for &(_, user, admin) in &rows {
            let Some(user) = user else { continue };
            let user = id(user)?;
            members.insert(user);
            if admin == Some(true) {
                admins.insert(user);
            }
        }
        self.state.members.load(
            conversation,
            Conversation {
                partition: at.partition,
                members,
                admins,
                // The database is at least as new as this event: apply what follows.
                offset: at.offset - 1,
                // No row, no conversation: no event of it carries a version either.
                version: rows.first().map(|&(v, _, _)| v),
            },
        );
        Ok(())
    }

    /// Produces one list; `trace`: the `traceparent` header it carries to the gateway.
    fn send(&mut self, r: Routed, trace: Option<&str>) -> Result<(), Failure> {
        let payload = self.out.codec.encode(&r.delivery);
        let key = r.delivery.conversation_id.to_string();
        let users = r.delivery.user_ids.len();
        let n = self.state.number();
        self.out.unacked.add(n);
        tracing::debug!(
            conversation_id = %r.delivery.conversation_id,
            seq = ?r.delivery.seq,
            partition = r.partition,
            users,
            "fanout list"
        );
        let mut record = BaseRecord::with_opaque_to(&self.cfg.deliveries_topic, n as usize)
            .partition(r.partition)
            .key(&key)
            .payload(&payload);
        if let Some(trace) = trace {
            record = record.headers(OwnedHeaders::new().insert(Header {
                key: chatpipe_core::telemetry::TRACEPARENT,
                value: Some(trace),
            }));
        }
        self.produce(record, n)?;
        metrics::counter!("fanout_deliveries_total").increment(1);
        metrics::counter!("fanout_recipients_total").increment(users as u64);
        metrics::histogram!("fanout_list_size").record(users as f64);
        Ok(())
    }

    /// Hands a record numbered `n` to the producer, waiting while its queue is full.
    fn produce(
        &self,
        mut record: BaseRecord<'_, String, Vec<u8>, usize>,
        n: u64,
    ) -> Result<(), Failure> {
        loop {
            match self.out.producer.send(record) {
                Ok(()) => return Ok(()),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    // The bound (fanout.produce_queue_max) holds: wait for the broker.
                    metrics::counter!("fanout_produce_queue_full_total").increment(1);
                    std::thread::sleep(Duration::from_millis(5));
                    record = back;
                }
                Err((err, _)) => {
                    self.out.unacked.done(n);
                    return Err(Failure::retriable(
                        anyhow::Error::from(err).context("producing to Kafka"),
                    ));
                }
            }
        }
    }

    /// Writes tombstones for presence entries whose gateway stopped renewing them long
    /// ago, so chat.presence does not keep dead gateways' users forever. Several fanout
    /// members may write the same tombstone; that is harmless.
    fn tombstone(&self, gone: &[(UserId, Arc<str>)]) {
        for (user, gateway) in gone {
            let key = chatpipe_schemas::presence::key(*user, gateway);
            let record: BaseRecord<'_, str, [u8], usize> =
                BaseRecord::with_opaque_to(&self.cfg.presence_topic, usize::MAX).key(&key);
            // Not waited for: the tombstone is housekeeping, not a condition for progress.
            if let Err((err, _)) = self.out.producer.send(record) {
                tracing::warn!("tombstoning {key}: {err}");
            } else {
                metrics::counter!("fanout_presence_tombstones_total").increment(1);
            }
        }
    }
}
