//! The cold tier: messages archived to Apache Cassandra (`[storage]`), keyed as Discord
//! keys theirs: partition `(conversation_id, bucket)` with `bucket = seq / bucket_size`,
//! rows clustered by `seq`. A history page names one conversation and a seq range, so it
//! reads one or two partitions.
//!
//! # Versions instead of order
//! Every change of a message carries its own time, strictly later than the one before
//! it (PostgreSQL's edit and delete take `greatest(now(), previous + 1 µs)`), and every
//! write here is made `USING TIMESTAMP` that time. Cassandra keeps the cell with the
//! highest write timestamp, so the writes of one message may land in any order, twice,
//! or from a reader that lost its partitions a moment ago: the result is the latest
//! version. A replayed `message.new` can never bring back a deleted body.
//!
//! Times are stored as microseconds since the epoch (`bigint`), as PostgreSQL keeps them:
//! CQL's `timestamp` holds milliseconds and would change what history answers.

mod session;
mod tier;

pub use session::{Cold, Schema, Start};
pub use tier::ColdTier;

use chatpipe_schemas::ChatEvent;
use chrono::{DateTime, Utc};
use serde::Deserialize;

/// `[storage]`: the two tiers.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StorageSettings {
    /// Cassandra contact points, `host:port`, comma-separated (`CASSANDRA_NODES`).
    pub cassandra_nodes: String,
    pub keyspace: String,
    /// The keyspace's replication, a CQL map: `{'class': 'NetworkTopologyStrategy',
    /// 'datacenter1': 3}` in a cluster. Used when the keyspace is created, never after.
    pub replication: String,
    /// Messages per Cassandra partition. Fixed for the life of the archive: the keyspace
    /// records it, and a process configured otherwise refuses to start.
    pub bucket_size: i64,
    /// A message row stays in PostgreSQL at least this long.
    pub hot_retention_s: u64,
    /// A Cassandra request answers within this or fails (and is retried by its caller).
    pub request_timeout_ms: u64,
    pub connect_timeout_ms: u64,
}

impl StorageSettings {
    pub fn nodes(&self) -> Vec<&str> {
        self.cassandra_nodes
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .collect()
    }

    /// The partition `seq` lives in.
    pub fn bucket(&self, seq: i64) -> i64 {
        seq / self.bucket_size
    }
}

/// One change of an archived message, from `chat.events`.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    New {
        conversation: i64,
        seq: i64,
        sender: i64,
        client_msg_id: uuid::Uuid,
        body: String,
        created_at: i64,
        /// A reply's thread root.
        thread_root: Option<i64>,
    },
    Edited {
        conversation: i64,
        seq: i64,
        sender: i64,
        body: String,
        edited_at: i64,
    },
    Deleted {
        conversation: i64,
        seq: i64,
        sender: i64,
        deleted_by: i64,
        deleted_at: i64,
    },
}

impl Change {
    /// The change an event makes to the archive, if any (other events change nothing here).
    pub fn of(event: &ChatEvent) -> Option<Self> {
        Some(match event {
            ChatEvent::MessageNew(m) => Self::New {
                conversation: m.conversation_id.get(),
                seq: m.seq.get(),
                sender: m.sender_id.get(),
                client_msg_id: m.client_msg_id,
                body: m.body.clone(),
                created_at: micros(m.created_at),
                thread_root: m.thread_root_seq.map(|s| s.get()),
            },
            ChatEvent::MessageEdited(m) => Self::Edited {
                conversation: m.conversation_id.get(),
                seq: m.seq.get(),
                sender: m.sender_id.get(),
                body: m.body.clone(),
                edited_at: micros(m.edited_at),
            },
            ChatEvent::MessageDeleted(m) => Self::Deleted {
                conversation: m.conversation_id.get(),
                seq: m.seq.get(),
                sender: m.sender_id.get(),
                deleted_by: m.deleted_by.get(),
                deleted_at: micros(m.deleted_at),
            },
            _ => return None,
        })
    }

    pub fn conversation(&self) -> i64 {
        match self {
            Self::New { conversation, .. }
            | Self::Edited { conversation, .. }
            | Self::Deleted { conversation, .. } => *conversation,
        }
    }

    pub fn seq(&self) -> i64 {
        match self {
            Self::New { seq, .. } | Self::Edited { seq, .. } | Self::Deleted { seq, .. } => *seq,
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            Self::New { .. } => "new",
            Self::Edited { .. } => "edited",
            Self::Deleted { .. } => "deleted",
        }
    }
}

/// Microseconds since the epoch: PostgreSQL's precision, and Cassandra's write timestamps'.
pub fn micros(at: DateTime<Utc>) -> i64 {
    at.timestamp_micros()
}

/// The message table's columns, in the order a [`ColdRow`] holds them.
pub const COLUMNS: &str =
    "seq, sender_id, client_msg_id, body, created_at_us, edited_at_us, deleted_at_us, deleted_by,
     thread_root_seq";

/// An archived message, as a row of the cold table.
pub type ColdRow = (
    i64,                // seq
    Option<i64>,        // sender_id
    Option<uuid::Uuid>, // client_msg_id
    Option<String>,     // body
    Option<i64>,        // created_at_us
    Option<i64>,        // edited_at_us
    Option<i64>,        // deleted_at_us
    Option<i64>,        // deleted_by
    Option<i64>,        // thread_root_seq
);

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(nodes: &str) -> StorageSettings {
        StorageSettings {
            cassandra_nodes: nodes.into(),
            keyspace: "chatpipe".into(),
            replication: "{'class': 'SimpleStrategy', 'replication_factor': 1}".into(),
            bucket_size: 1000,
            hot_retention_s: 1,
            request_timeout_ms: 1,
            connect_timeout_ms: 1,
        }
    }

    #[test]
    fn buckets_hold_bucket_size_seqs() {
        let s = settings("a:1");
        assert_eq!(s.bucket(1), 0);
        assert_eq!(s.bucket(999), 0);
        assert_eq!(s.bucket(1000), 1);
        assert_eq!(s.bucket(2500), 2);
    }

    #[test]
    fn nodes_are_a_comma_list() {
        assert_eq!(settings(" a:1, b:2 ,").nodes(), vec!["a:1", "b:2"]);
    }
}
