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

use std::time::Duration;

use anyhow::Context;
use chatpipe_schemas::{ChatEvent, ConversationId};
use chrono::{DateTime, Utc};
use scylla::client::execution_profile::ExecutionProfile;
use scylla::client::session::Session;
use scylla::client::session_builder::SessionBuilder;
use scylla::statement::prepared::PreparedStatement;
use scylla::statement::Consistency;
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

/// The message table's columns, in the order [`ColdMessage`] reads them.
pub const COLUMNS: &str =
    "seq, sender_id, client_msg_id, body, created_at_us, edited_at_us, deleted_at_us, deleted_by";

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
);

/// The schema, in order; every statement is idempotent.
fn schema(settings: &StorageSettings) -> Vec<String> {
    let ks = &settings.keyspace;
    vec![
        format!(
            "CREATE KEYSPACE IF NOT EXISTS {ks} WITH replication = {}",
            settings.replication
        ),
        // The archive's own settings, written once (bucket_size).
        format!("CREATE TABLE IF NOT EXISTS {ks}.archive_settings (name text PRIMARY KEY, value bigint)"),
        format!(
            "CREATE TABLE IF NOT EXISTS {ks}.message (
                conversation_id bigint, bucket bigint, seq bigint,
                sender_id bigint, client_msg_id uuid, body text,
                created_at_us bigint, edited_at_us bigint, deleted_at_us bigint, deleted_by bigint,
                PRIMARY KEY ((conversation_id, bucket), seq)
            ) WITH CLUSTERING ORDER BY (seq ASC)"
        ),
    ]
}

/// A session to the cold tier, its schema made, with the statements the archive runs.
pub struct Cold {
    session: Session,
    settings: StorageSettings,
    insert_new: PreparedStatement,
    update_edited: PreparedStatement,
    update_deleted: PreparedStatement,
    select_range: PreparedStatement,
}

impl Cold {
    /// Connects (every request `LOCAL_QUORUM`, with the configured timeout), makes the
    /// schema if it is missing and checks the archive's bucket size against ours.
    pub async fn open(settings: &StorageSettings) -> anyhow::Result<Self> {
        let profile = ExecutionProfile::builder()
            .consistency(Consistency::LocalQuorum)
            .request_timeout(Some(Duration::from_millis(settings.request_timeout_ms)))
            .build();
        let session = SessionBuilder::new()
            .known_nodes(settings.nodes())
            .connection_timeout(Duration::from_millis(settings.connect_timeout_ms))
            .default_execution_profile_handle(profile.into_handle())
            .build()
            .await
            .with_context(|| {
                format!(
                    "connecting to Cassandra at {} (storage.cassandra_nodes / CASSANDRA_NODES)",
                    settings.cassandra_nodes
                )
            })?;
        for statement in schema(settings) {
            session
                .query_unpaged(statement.as_str(), ())
                .await
                .with_context(|| format!("making the cold tier's schema: {statement}"))?;
        }
        session
            .await_schema_agreement()
            .await
            .context("waiting for Cassandra's nodes to agree on the schema")?;
        check_bucket_size(&session, settings).await?;
        let ks = &settings.keyspace;
        let insert_new = session
            .prepare(format!(
                "INSERT INTO {ks}.message (conversation_id, bucket, seq, sender_id, client_msg_id, body, created_at_us)
                 VALUES (?, ?, ?, ?, ?, ?, ?) USING TIMESTAMP ?"
            ))
            .await?;
        let update_edited = session
            .prepare(format!(
                "UPDATE {ks}.message USING TIMESTAMP ? SET sender_id = ?, body = ?, edited_at_us = ?
                  WHERE conversation_id = ? AND bucket = ? AND seq = ?"
            ))
            .await?;
        let update_deleted = session
            .prepare(format!(
                "UPDATE {ks}.message USING TIMESTAMP ?
                    SET sender_id = ?, body = null, deleted_at_us = ?, deleted_by = ?
                  WHERE conversation_id = ? AND bucket = ? AND seq = ?"
            ))
            .await?;
        let select_range = session
            .prepare(format!(
                "SELECT {COLUMNS} FROM {ks}.message
                  WHERE conversation_id = ? AND bucket = ? AND seq >= ? AND seq <= ?"
            ))
            .await?;
        Ok(Self {
            session,
            settings: settings.clone(),
            insert_new,
            update_edited,
            update_deleted,
            select_range,
        })
    }

    pub fn session(&self) -> &Session {
        &self.session
    }

    pub fn settings(&self) -> &StorageSettings {
        &self.settings
    }

    /// Writes one change, at the change's own time (idempotent, order-independent).
    pub async fn write(&self, change: &Change) -> anyhow::Result<()> {
        let bucket = self.settings.bucket(change.seq());
        match change {
            Change::New {
                conversation,
                seq,
                sender,
                client_msg_id,
                body,
                created_at,
            } => {
                self.session
                    .execute_unpaged(
                        &self.insert_new,
                        (
                            conversation,
                            bucket,
                            seq,
                            sender,
                            client_msg_id,
                            body,
                            created_at,
                            created_at,
                        ),
                    )
                    .await?
            }
            Change::Edited {
                conversation,
                seq,
                sender,
                body,
                edited_at,
            } => {
                self.session
                    .execute_unpaged(
                        &self.update_edited,
                        (
                            edited_at,
                            sender,
                            body,
                            edited_at,
                            conversation,
                            bucket,
                            seq,
                        ),
                    )
                    .await?
            }
            Change::Deleted {
                conversation,
                seq,
                sender,
                deleted_by,
                deleted_at,
            } => {
                self.session
                    .execute_unpaged(
                        &self.update_deleted,
                        (
                            deleted_at,
                            sender,
                            deleted_at,
                            deleted_by,
                            conversation,
                            bucket,
                            seq,
                        ),
                    )
                    .await?
            }
        };
        Ok(())
    }

    /// Every archived row of `conversation` with `from <= seq <= to`, ascending: one
    /// query per bucket the range touches.
    pub async fn range(
        &self,
        conversation: ConversationId,
        from: i64,
        to: i64,
    ) -> anyhow::Result<Vec<ColdRow>> {
        let mut rows = Vec::new();
        if from > to {
            return Ok(rows);
        }
        for bucket in self.settings.bucket(from)..=self.settings.bucket(to) {
            let result = self
                .session
                .execute_unpaged(&self.select_range, (conversation.get(), bucket, from, to))
                .await?
                .into_rows_result()?;
            for row in result.rows::<ColdRow>()? {
                rows.push(row?);
            }
        }
        Ok(rows)
    }
}

/// The archive's bucket size is fixed when it is first written: a process configured
/// otherwise would look for messages in the wrong partitions.
async fn check_bucket_size(session: &Session, settings: &StorageSettings) -> anyhow::Result<()> {
    let ks = &settings.keyspace;
    session
        .query_unpaged(
            format!(
                "INSERT INTO {ks}.archive_settings (name, value) VALUES ('bucket_size', ?) IF NOT EXISTS"
            ),
            (settings.bucket_size,),
        )
        .await
        .context("recording the archive's bucket size")?;
    let (recorded,): (Option<i64>,) = session
        .query_unpaged(
            format!("SELECT value FROM {ks}.archive_settings WHERE name = 'bucket_size'"),
            (),
        )
        .await?
        .into_rows_result()?
        .single_row()?;
    anyhow::ensure!(
        recorded == Some(settings.bucket_size),
        "storage.bucket_size is {} but the archive in keyspace {ks} was written with {recorded:?}: \
         set it back (a bucket size cannot change once messages are archived)",
        settings.bucket_size
    );
    Ok(())
}

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
