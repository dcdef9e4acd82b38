//! The presence feed: every fanout member reads all of the compacted chat.presence from
//! the beginning into its presence table ([`super::online`]), a global table in Kafka
//! Streams' terms, on a reader of its own. Fanout starts joining events only once the
//! table has caught up with the topic's end as of start, so the first events already
//! see everyone who is connected.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use chatpipe_schemas::presence::{parse_key, Presence};
use chatpipe_schemas::UserId;
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
}

impl PresenceTable {
    fn reached(&mut self, at: Position) {
        if self
            .ends
            .get(&at.partition)
            .is_some_and(|end| at.offset + 1 >= *end)
        {
            self.ends.remove(&at.partition);
        }
        self.check_caught_up();
    }

    pub fn check_caught_up(&self) {
        if self.ends.is_empty() && !self.caught_up.swap(true, Ordering::Relaxed) {
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
                Some(p) => online.upsert(
                    p.user_id,
                    Gateway {
                        id: Arc::from(p.gateway_id.as_str()),
                        partition: p.partition,
                    },
                    p.lease_expires_at,
                ),
            }
        }
        self.reached(at);
        Ok(())
    }

    fn skip(&mut self, at: Position, _key: Option<&[u8]>) {
        self.reached(at);
    }
}
