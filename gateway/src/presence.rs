//! Presence: this gateway tells chat.presence which users it holds. A user's record
//! (key `<userId>@<gatewayId>`) is written when their session count changes and renewed
//! every `renew_ms` with a lease of `lease_ms`; the last session leaving writes a
//! tombstone. A gateway that dies without a word stops counting when its leases expire.
//! When no record was acknowledged for a whole lease, fanout may count this gateway's
//! users offline: once the broker answers again, every lease is renewed at once and the
//! clients are told to catch up ([`crate::resync`]).

use std::collections::HashMap;
use std::time::Duration;

use chatpipe_core::kafka::FutureProducer;
use chatpipe_core::UserId;
use chatpipe_schemas::presence::{key, Presence, PresenceCodec};
use futures::future::join_all;
use rdkafka::producer::FutureRecord;

use crate::resync::{self, Lapse};
use crate::sessions::Sessions;

/// Renewals per `renew` interval; each renews the users whose id falls in its slice.
const RENEW_SLICES: i64 = 10;

pub struct Publisher {
    pub producer: FutureProducer,
    pub codec: PresenceCodec,
    pub topic: String,
    pub gateway_id: String,
    pub partition: i32,
    pub lease: Duration,
    pub renew: Duration,
}

impl Publisher {
    /// Publishes changes as they happen and renews every lease once per `renew`, until
    /// `shutdown`. Renewals are spread: each of `RENEW_SLICES` ticks per `renew` renews
    /// the users of one slice, so thousands of users never become one burst of records
    /// (which would hold up pushes here and in fanout).
    pub async fn run(&self, sessions: Sessions, shutdown: impl std::future::Future<Output = ()>) {
        let mut renew = tokio::time::interval(self.renew / RENEW_SLICES as u32);
        let mut slice: i64 = 0;
        let mut lapse = Lapse::new(self.lease, tokio::time::Instant::now());
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                () = sessions.changed() => {
                    let changes = sessions.take_changes();
                    self.publish_watching(&changes, &sessions, &mut lapse).await;
                }
                _ = renew.tick() => {
                    let all = sessions.counts();
                    metrics::gauge!("gateway_presence_users").set(all.len() as f64);
                    let due: Vec<_> = all
                        .into_iter()
                        .filter(|(user, _)| user.get().rem_euclid(RENEW_SLICES) == slice)
                        .collect();
                    self.publish_watching(&due, &sessions, &mut lapse).await;
                    slice = (slice + 1) % RENEW_SLICES;
                }
                () = &mut shutdown => break,
            }
        }
    }

    /// [`Publisher::publish`], watching for a lapse: after one, every lease is renewed at
    /// once (fanout may count them all expired), and once that is acknowledged the
    /// clients are told to resync.
    async fn publish_watching(
        &self,
        users: &[(UserId, usize)],
        sessions: &Sessions,
        lapse: &mut Lapse,
    ) {
        use tokio::time::Instant;
        if users.is_empty() {
            return;
        }
        if !self.publish(users, sessions).await {
            lapse.unacknowledged(Instant::now());
            return;
        }
        let Some(silent) = lapse.acknowledged(Instant::now()) else {
            return;
        };
        if self.publish(&sessions.counts(), sessions).await {
            resync::broadcast(
                sessions,
                resync::Cause::Presence,
                &format!(
                    "pushes may have been lost: the broker acknowledged none of this gateway's \
                     presence records for {:.1} s, longer than a lease",
                    silent.as_secs_f64()
                ),
            );
        } else {
            lapse.still_lapsed(Instant::now());
        }
    }

    /// Writes the presence of `users` (count 0: a tombstone), waiting for the acks about
    /// one renewal tick (at least 1 s, at most half a lease): a record the broker has not
    /// acknowledged by then stays queued in the producer (in order, per user), but the
    /// renewals of the others must not wait behind it. After a broker restart an acknowledgement can take tens of
    /// seconds, longer than a lease; waiting for it here let every lease of the gateway
    /// expire in fanout, and pushes stopped for that long. True when every record was
    /// acknowledged in that time.
    pub async fn publish(&self, users: &[(UserId, usize)], sessions: &Sessions) -> bool {
        // Sessions waiting for a record written after they joined: these are.
        let present: Vec<UserId> = users
            .iter()
            .filter(|(_, n)| *n > 0)
            .map(|(u, _)| *u)
            .collect();
        let claimed = sessions.claim_ready(&present);
        let (acknowledged, written) = self.write(users).await;
        for (user, waiting) in claimed {
            sessions.presence_written(user, waiting, written.get(&user).copied());
        }
        acknowledged
    }

    /// [`Publisher::publish`]'s writes: whether all were acknowledged in time, and where
    /// each acknowledged one is.
    async fn write(&self, users: &[(UserId, usize)]) -> (bool, HashMap<UserId, (i32, i64)>) {
        let expires = chrono::Utc::now().timestamp_millis() + self.lease.as_millis() as i64;
        let sends = users.iter().map(|(user, count)| {
            let key = key(*user, &self.gateway_id);
            let value = (*count > 0).then(|| {
                self.codec.encode(&Presence {
                    user_id: *user,
                    gateway_id: self.gateway_id.clone(),
                    partition: self.partition,
                    sessions: i32::try_from(*count).unwrap_or(i32::MAX),
                    lease_expires_at: expires,
                })
            });
            async move {
                let mut record: FutureRecord<'_, str, [u8]> =
                    FutureRecord::to(&self.topic).key(&key);
                if let Some(value) = &value {
                    record = record.payload(value);
                }
                (
                    *user,
                    self.producer.send(record, Duration::from_secs(10)).await,
                )
            }
        });
        let tick = self.renew / RENEW_SLICES as u32;
        let wait = tick.max(Duration::from_secs(1)).min(self.lease / 2);
        let Ok(results) = tokio::time::timeout(wait, join_all(sends)).await else {
            metrics::counter!("gateway_presence_unacknowledged_total")
                .increment(users.len() as u64);
            tracing::warn!(
                users = users.len(),
                "presence records not acknowledged within {wait:?}: left queued in the producer"
            );
            return (false, HashMap::new());
        };
        let mut acknowledged = true;
        let mut written = HashMap::new();
        for (user, result) in results {
            match result {
                Ok(at) => {
                    written.insert(user, (at.partition, at.offset));
                    metrics::counter!("gateway_presence_records_total").increment(1);
                }
                Err((err, _)) => {
                    acknowledged = false;
                    metrics::counter!("gateway_presence_errors_total").increment(1);
                    tracing::warn!("publishing presence: {err}");
                }
            }
        }
        (acknowledged, written)
    }
}
