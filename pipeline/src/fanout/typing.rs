//! Typing indicators: `chat.ephemeral` (gateways write their clients' `typing` frames
//! there) joined with membership and presence into fanout lists on `chat.deliveries`.
//! Nothing of it touches PostgreSQL's tables or `chat.events`; membership is read from
//! PostgreSQL (cached for `typing_members_ttl_ms`), so a non-member's typing reaches
//! nobody and a member removed stops being told within that time. At most
//! `typing_member_loads_per_sec` conversations are read a second: a signal for another
//! conversation not cached is dropped, so ids a client makes up cost the database a
//! bounded rate.
//!
//! Per (conversation, user), at most one typing signal per `typing_throttle_ms` (3 s) is
//! pushed, however many devices and frames it comes from; a signal older than
//! `typing_expiry_ms` (6 s) is dropped (it would be over before it arrived). Clients show
//! a typing state until 6 s after the last frame (docs/protocol.md).
//!
//! Best effort, like every push: the reader commits what it read and lists are produced
//! without waiting for acknowledgements.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use chatpipe_core::kafka::BaseProducer;
use chatpipe_schemas::delivery::{Delivery, DeliveryCodec};
use chatpipe_schemas::ephemeral::{Ephemeral, TYPING};
use chatpipe_schemas::{ConversationId, UserId};
use rdkafka::producer::{BaseRecord, Producer};
use sqlx::PgPool;
use tokio::runtime::Handle;

use super::plan::{self, Routed};
use super::Status;
use crate::settings::FanoutSettings;
use chatpipe_runtime::{Failure, Position, Processor};

pub struct Typing {
    pub handle: Handle,
    pub pool: PgPool,
    pub codec: DeliveryCodec,
    pub producer: BaseProducer,
    pub status: Arc<Status>,
    pub cfg: FanoutSettings,
    /// Members per conversation, and when they were read.
    pub members: HashMap<ConversationId, (Instant, HashSet<UserId>)>,
    /// When each (conversation, user) was last pushed.
    pub pushed: HashMap<(ConversationId, UserId), Instant>,
    /// partition -> the offset after the last record read.
    pub read: HashMap<i32, i64>,
    pub next_sweep: Instant,
    /// `typing_member_loads_per_sec`.
    pub loads: governor::DefaultDirectRateLimiter,
}

/// The budget of membership loads (`typing_member_loads_per_sec`, at least 1).
pub fn load_budget(per_sec: u32) -> governor::DefaultDirectRateLimiter {
    let per_sec = std::num::NonZeroU32::new(per_sec.max(1)).expect("at least 1");
    governor::RateLimiter::direct(governor::Quota::per_second(per_sec))
}

/// Why a typing signal went to nobody.
fn dropped(reason: &'static str) {
    metrics::counter!("fanout_typing_dropped_total", "reason" => reason).increment(1);
}

impl Typing {
    fn throttle(&self) -> Duration {
        Duration::from_millis(self.cfg.typing_throttle_ms)
    }

    /// The members of `conversation`, from the cache or PostgreSQL; `None` when they
    /// are not cached and the second's loads are spent.
    fn members_of(
        &mut self,
        conversation: ConversationId,
    ) -> Result<Option<&HashSet<UserId>>, Failure> {
        let ttl = Duration::from_millis(self.cfg.typing_members_ttl_ms);
        let fresh = self
            .members
            .get(&conversation)
            .is_some_and(|(at, _)| at.elapsed() < ttl);
        if !fresh {
            if self.loads.check().is_err() {
                return Ok(None);
            }
            let rows: Vec<i64> = self
                .handle
                .block_on(
                    sqlx::query_scalar(
                        "SELECT user_id FROM conversation_member WHERE conversation_id = $1",
                    )
                    .bind(conversation.get())
                    .fetch_all(&self.pool),
                )
                .with_context(|| format!("reading the members of conversation {conversation}"))
                .map_err(Failure::Retriable)?;
            metrics::counter!("fanout_typing_membership_loads_total").increment(1);
            let members = rows
                .into_iter()
                .filter_map(|u| UserId::new(u).ok())
                .collect();
            self.members.insert(conversation, (Instant::now(), members));
        }
        Ok(Some(&self.members[&conversation].1))
    }

    fn push(&mut self, e: &Ephemeral) -> Result<(), Failure> {
        let age = chrono::Utc::now() - e.at;
        if age.num_milliseconds() > self.cfg.typing_expiry_ms as i64 {
            dropped("stale");
            return Ok(());
        }
        let key = (e.conversation_id, e.user_id);
        if self
            .pushed
            .get(&key)
            .is_some_and(|at| at.elapsed() < self.throttle())
        {
            dropped("throttled");
            return Ok(());
        }
        let Some(members) = self.members_of(e.conversation_id)? else {
            dropped("membership_budget");
            return Ok(());
        };
        if !members.contains(&e.user_id) {
            dropped("non_member");
            return Ok(());
        }
        let others: HashSet<UserId> = members
            .iter()
            .copied()
            .filter(|u| *u != e.user_id)
            .collect();
        let routed = {
            let online = self.status.online.lock().expect("presence lock");
            plan::route_to(&others, &online, super::now_ms(), &template(e))
        };
        self.pushed.insert(key, Instant::now());
        metrics::counter!("fanout_typing_pushed_total").increment(1);
        for r in routed {
            self.send(r);
        }
        Ok(())
    }

    /// Produces one list; a full queue drops it (typing is worth nothing late).
    fn send(&self, r: Routed) {
        let payload = self.codec.encode(&r.delivery);
        let key = r.delivery.conversation_id.to_string();
        let record = BaseRecord::to(&self.cfg.deliveries_topic)
            .partition(r.partition)
            .key(&key)
            .payload(&payload);
        if self.producer.send(record).is_err() {
            dropped("queue_full");
        }
    }
}

impl Processor for Typing {
    type Record = Ephemeral;

    fn apply(&mut self, at: Position, e: Ephemeral) -> Result<(), Failure> {
        if e.kind == TYPING {
            self.push(&e)?;
        } else {
            dropped("unknown_type");
        }
        self.read.insert(at.partition, at.offset + 1);
        Ok(())
    }

    fn skip(&mut self, at: Position, _key: Option<&[u8]>) {
        self.read.insert(at.partition, at.offset + 1);
    }

    fn tick(&mut self) -> Result<(), Failure> {
        self.producer.poll(Duration::ZERO);
        if Instant::now() >= self.next_sweep {
            // Forget what no longer throttles or is no longer fresh.
            let (throttle, ttl) = (
                self.throttle(),
                Duration::from_millis(self.cfg.typing_members_ttl_ms),
            );
            self.pushed.retain(|_, at| at.elapsed() < throttle);
            self.members.retain(|_, (at, _)| at.elapsed() < ttl);
            self.next_sweep = Instant::now() + Duration::from_secs(1);
        }
        Ok(())
    }

    fn committable(&mut self) -> Vec<(i32, i64)> {
        self.read.drain().collect()
    }

    fn revoke(&mut self, _partitions: &[i32]) {}

    fn finish(&mut self) -> Result<(), Failure> {
        let _ = self.producer.flush(Duration::from_secs(2));
        Ok(())
    }
}

/// The template of a typing list (its users filled in per gateway).
pub fn template(e: &Ephemeral) -> Delivery {
    Delivery {
        user_id: Some(e.user_id),
        ..plan::template(
            chatpipe_schemas::delivery::TYPING,
            e.conversation_id,
            e.at.timestamp_micros(),
        )
    }
}
