//! The presence feed: every fanout member reads all of the compacted chat.presence from
//! the beginning into its presence table ([`super::online`]), a global table in Kafka
//! Streams' terms, on a reader of its own. Fanout starts joining events only once the
//! table has caught up with the topic's end as of start, so the first events already
//! see everyone who is connected.
//!
//! Fanout's reader also tells each gateway whose records it applied how far it has
//! read ([`Acks`], a `presence.applied` list on the gateway's partition of
//! chat.deliveries) and which chat.events partitions this member joins: once the
//! members that applied a new session's record cover every partition, the gateway tells
//! the session `ready` (docs/protocol.md). A member taking over a partition first applies
//! what chat.presence holds at that moment ([`catch_up_now`]), so a `ready` counted on
//! the partition's previous owner stays true.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use std::time::{Duration, Instant};

use anyhow::Context;
use chatpipe_core::kafka::{BaseProducer, CreateGuarded};
use chatpipe_schemas::delivery::{DeliveryCodec, PresenceApplied};
use chatpipe_schemas::presence::{parse_key, Presence};
use chatpipe_schemas::UserId;
use rdkafka::consumer::Consumer;
use rdkafka::producer::BaseRecord;
use rdkafka::Message;

use super::online::Gateway;
use super::Status;
use chatpipe_runtime::{Decode, Failure, Position, Processor, WriterSchemas};

/// One chat.presence record: a user's sessions on one gateway, or a tombstone.
pub struct PresenceRecord {
    pub user: UserId,
    pub gateway: String,
    /// `None`: a tombstone (the user left that gateway).
    pub presence: Option<Presence>,
}

impl Decode for PresenceRecord {
    fn decode(message: &impl Message, schemas: &mut WriterSchemas) -> Result<Self, Failure> {
        let (user, gateway) = message
            .key()
            .and_then(|k| std::str::from_utf8(k).ok())
            .and_then(parse_key)
            .ok_or_else(|| Failure::poison("presence key is not <userId>@<gatewayId>"))?;
        let gateway = gateway.to_owned();
        let presence = match message.payload() {
            None => None,
            Some(bytes) => {
                let writer = schemas.of(bytes)?;
                Some(
                    Presence::decode_with(writer, bytes)
                        .map_err(|e| Failure::poison(e.to_string()))?,
                )
            }
        };
        Ok(Self {
            user,
            gateway,
            presence,
        })
    }
}

/// Applies presence records to the shared table; says when it has read up to the
/// topic's end as of start.
pub struct PresenceTable {
    pub status: Arc<Status>,
    /// partition -> the end offset to reach before the table counts as caught up.
    pub ends: HashMap<i32, i64>,
    pub caught_up: Arc<AtomicBool>,
    /// Fanout's: the gateways told how far the table has read. `None` for the
    /// notifications processor's table.
    pub acks: Option<Acks>,
}

/// `presence.applied` lists for the gateways whose records were applied since the last
/// ones; sent on the reader's next turn, so a burst of records makes one list per
/// gateway.
pub struct Acks {
    pub producer: BaseProducer,
    pub codec: DeliveryCodec,
    pub topic: String,
    /// This member (one per process).
    pub member: String,
    /// gateway id -> its partition of chat.deliveries: owed a list.
    pub owed: HashMap<String, i32>,
    /// Every gateway seen in chat.presence (told again when the partitions this member
    /// joins change), and the partitions told last.
    pub known: HashMap<String, i32>,
    pub told_joins: Vec<i32>,
}

impl Acks {
    fn send(&mut self, status: &Status) {
        self.producer.poll(Duration::ZERO);
        let (event_partitions, event_partition_count) = status.joins();
        if event_partitions != self.told_joins {
            self.owed
                .extend(self.known.iter().map(|(g, p)| (g.clone(), *p)));
            self.told_joins.clone_from(&event_partitions);
        }
        if self.owed.is_empty() {
            return;
        }
        let applied = PresenceApplied {
            member: self.member.clone(),
            applied: status.presence_applied(),
            event_partitions,
            event_partition_count,
        };
        let now = chrono::Utc::now().timestamp_micros();
        for (gateway, partition) in std::mem::take(&mut self.owed) {
            let payload = self.codec.encode_presence_applied(&gateway, &applied, now);
            let record = BaseRecord::to(&self.topic)
                .key(self.member.as_str())
                .payload(&payload)
                .partition(partition);
            // Not sent: that gateway's sessions wait for the next list (every renewal
            // of a lease brings one).
            match self.producer.send(record) {
                Ok(()) => metrics::counter!("fanout_presence_acks_total").increment(1),
                Err((err, _)) => {
                    metrics::counter!("fanout_presence_ack_errors_total").increment(1);
                    tracing::warn!("presence.applied for a gateway: {err}");
                }
            }
        }
    }
}

/// Waits (at most `within`) until the presence table has applied what chat.presence
/// holds now. Fanout calls it before joining a newly assigned chat.events partition:
/// a gateway may have told a session `ready` counting on the partition's previous owner,
/// which had applied that session's record; this member must have too.
pub fn catch_up_now(
    status: &Status,
    kafka: &chatpipe_core::config::KafkaSettings,
    topic: &str,
    within: Duration,
) -> Result<(), Failure> {
    let ends = (|| -> anyhow::Result<HashMap<i32, i64>> {
        let client: chatpipe_core::kafka::BaseConsumer = kafka
            .client()
            .create_guarded()
            .context("creating a metadata client")?;
        let metadata = client
            .fetch_metadata(Some(topic), Duration::from_secs(10))
            .with_context(|| format!("reading the metadata of {topic}"))?;
        let mut ends = HashMap::new();
        for p in metadata.topics().iter().flat_map(|t| t.partitions()) {
            let (low, high) = client
                .fetch_watermarks(topic, p.id(), Duration::from_secs(10))
                .with_context(|| format!("watermarks of {topic}/{}", p.id()))?;
            if high > low {
                ends.insert(p.id(), high);
            }
        }
        Ok(ends)
    })()
    .map_err(Failure::Retriable)?;
    let deadline = Instant::now() + within;
    while !status.presence_reached(&ends) {
        if Instant::now() >= deadline {
            return Err(Failure::retriable(anyhow::anyhow!(
                "the presence table has not applied {topic} up to its end as of this assignment"
            )));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(())
}

impl PresenceTable {
    fn reached(&mut self, at: Position) {
        self.status.presence_read(at);
        self.check_caught_up();
    }

    pub fn check_caught_up(&self) {
        if !self.caught_up.load(Ordering::Relaxed)
            && self.status.presence_reached(&self.ends)
            && !self.caught_up.swap(true, Ordering::Relaxed)
        {
            tracing::info!("presence table caught up with chat.presence");
        }
    }
}

impl Processor for PresenceTable {
    type Record = PresenceRecord;

    fn apply(&mut self, at: Position, r: PresenceRecord) -> Result<(), Failure> {
        {
            let mut online = self.status.online.lock().expect("presence lock");
            match r.presence {
                None => online.remove(r.user, &r.gateway),
                Some(p) => {
                    if let Some(acks) = &mut self.acks {
                        acks.owed.insert(p.gateway_id.clone(), p.partition);
                        acks.known.insert(p.gateway_id.clone(), p.partition);
                    }
                    online.upsert(
                        p.user_id,
                        Gateway {
                            id: Arc::from(p.gateway_id.as_str()),
                            partition: p.partition,
                        },
                        p.lease_expires_at,
                    )
                }
            }
        }
        self.reached(at);
        Ok(())
    }

    fn tick(&mut self) -> Result<(), Failure> {
        if let Some(acks) = &mut self.acks {
            acks.send(&self.status);
        }
        Ok(())
    }

    fn skip(&mut self, at: Position, _key: Option<&[u8]>) {
        self.reached(at);
    }
}
