//! The session to Cassandra: the schema, the statements the archive runs, and reads.

use std::time::Duration;

use anyhow::Context;
use scylla::client::execution_profile::ExecutionProfile;
use scylla::client::session::Session;
use scylla::client::session_builder::SessionBuilder;
use scylla::serialize::row::{RowSerializationContext, SerializeRow};
use scylla::serialize::writers::RowWriter;
use scylla::serialize::SerializationError;
use scylla::statement::batch::{Batch, BatchType};
use scylla::statement::prepared::PreparedStatement;
use scylla::statement::Consistency;

use super::{Change, ColdRow, StorageSettings, COLUMNS};

/// The schema, in order; every statement is idempotent.
fn schema_statements(settings: &StorageSettings) -> Vec<String> {
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
        // Threads (issue 29): a reply's root; null for a top-level message.
        format!("ALTER TABLE {ks}.message ADD IF NOT EXISTS thread_root_seq bigint"),
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
    select_newest: PreparedStatement,
    select_oldest: PreparedStatement,
    select_seqs: PreparedStatement,
}

/// Whether [`Cold::open`] makes the schema (the archiver) or expects it (readers: the
/// archiver makes it before anything is archived).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Schema {
    Make,
    Expect,
}

/// Which end of a seq range a [`Cold::page`] starts from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    Newest,
    Oldest,
}

impl Cold {
    /// Connects (every request `LOCAL_QUORUM`, with the configured timeout); with
    /// [`Schema::Make`] makes the schema if it is missing; checks the archive's bucket
    /// size against ours.
    pub async fn open(settings: &StorageSettings, schema: Schema) -> anyhow::Result<Self> {
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
        if schema == Schema::Make {
            for statement in schema_statements(settings) {
                session
                    .query_unpaged(statement.as_str(), ())
                    .await
                    .with_context(|| format!("making the cold tier's schema: {statement}"))?;
            }
            session
                .await_schema_agreement()
                .await
                .context("waiting for Cassandra's nodes to agree on the schema")?;
        }
        check_bucket_size(&session, settings, schema).await?;
        let ks = &settings.keyspace;
        let insert_new = session
            .prepare(format!(
                "INSERT INTO {ks}.message (conversation_id, bucket, seq, sender_id, client_msg_id, body, created_at_us, thread_root_seq)
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?) USING TIMESTAMP ?"
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
        // One bucket's rows with `? <= seq <= ?`, all of them or the first `?` from an end.
        let select = |tail: &str| {
            session.prepare(format!(
                "SELECT {COLUMNS} FROM {ks}.message
                  WHERE conversation_id = ? AND bucket = ? AND seq >= ? AND seq <= ? {tail}"
            ))
        };
        let select_range = select("").await?;
        let select_newest = select("ORDER BY seq DESC LIMIT ?").await?;
        let select_oldest = select("ORDER BY seq ASC LIMIT ?").await?;
        let select_seqs = session
            .prepare(format!(
                "SELECT {COLUMNS} FROM {ks}.message
                  WHERE conversation_id = ? AND bucket = ? AND seq IN ?"
            ))
            .await?;
        Ok(Self {
            session,
            settings: settings.clone(),
            insert_new,
            update_edited,
            update_deleted,
            select_range,
            select_newest,
            select_oldest,
            select_seqs,
        })
    }

    pub fn session(&self) -> &Session {
        &self.session
    }

    pub fn settings(&self) -> &StorageSettings {
        &self.settings
    }

    /// The partition `(conversation_id, bucket)` a change writes to.
    pub fn partition_of(&self, change: &Change) -> (i64, i64) {
        (change.conversation(), self.settings.bucket(change.seq()))
    }

    /// Writes the changes of one partition ([`Cold::partition_of`]), each at its own
    /// time (idempotent, order-independent): one request, a single-partition `UNLOGGED`
    /// batch when there are several. Cassandra applies such a batch as one mutation,
    /// with no batch log and no size limit of its own (batch_size_fail_threshold counts
    /// batches over several partitions only, CASSANDRA-10876); the caller bounds its rows.
    pub async fn write_partition(&self, changes: &[&Change]) -> anyhow::Result<()> {
        match changes {
            [] => {}
            [one] => {
                let (statement, values) = self.statement(one);
                self.session.execute_unpaged(statement, values).await?;
            }
            several => {
                let mut batch = Batch::new(BatchType::Unlogged);
                let mut values = Vec::with_capacity(several.len());
                for change in several {
                    let (statement, row) = self.statement(change);
                    batch.append_statement(statement.clone());
                    values.push(row);
                }
                self.session.batch(&batch, values).await?;
            }
        }
        Ok(())
    }

    /// The statement a change runs and its values, stamped with the change's own time.
    fn statement<'a>(&self, change: &'a Change) -> (&PreparedStatement, ChangeValues<'a>) {
        let bucket = self.settings.bucket(change.seq());
        match *change {
            Change::New {
                conversation,
                seq,
                sender,
                client_msg_id,
                ref body,
                created_at,
                thread_root,
            } => (
                &self.insert_new,
                ChangeValues::New((
                    conversation,
                    bucket,
                    seq,
                    sender,
                    client_msg_id,
                    body,
                    created_at,
                    thread_root,
                    created_at,
                )),
            ),
            Change::Edited {
                conversation,
                seq,
                sender,
                ref body,
                edited_at,
            } => (
                &self.update_edited,
                ChangeValues::Edited((
                    edited_at,
                    sender,
                    body,
                    edited_at,
                    conversation,
                    bucket,
                    seq,
                )),
            ),
            Change::Deleted {
                conversation,
                seq,
                sender,
                deleted_by,
                deleted_at,
            } => (
                &self.update_deleted,
                ChangeValues::Deleted((
                    deleted_at,
                    sender,
                    deleted_at,
                    deleted_by,
                    conversation,
                    bucket,
                    seq,
                )),
            ),
        }
    }

    /// Every archived row of `conversation` with `from <= seq <= to`, ascending: one
    /// query per bucket the range touches.
    pub async fn range(
        &self,
        conversation: i64,
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
                .execute_unpaged(&self.select_range, (conversation, bucket, from, to))
                .await?
                .into_rows_result()?;
            for row in result.rows::<ColdRow>()? {
                rows.push(row?);
            }
        }
        Ok(rows)
    }
}

impl Cold {
    /// The archived rows of `conversation` with these seqs (those it has), ascending:
    /// one query per bucket they fall in.
    pub async fn seqs(&self, conversation: i64, seqs: &[i64]) -> anyhow::Result<Vec<ColdRow>> {
        let mut by_bucket: std::collections::BTreeMap<i64, Vec<i64>> = Default::default();
        for &seq in seqs {
            by_bucket
                .entry(self.settings.bucket(seq))
                .or_default()
                .push(seq);
        }
        let mut rows = Vec::new();
        for (bucket, seqs) in by_bucket {
            let result = self
                .session
                .execute_unpaged(&self.select_seqs, (conversation, bucket, seqs))
                .await?
                .into_rows_result()?;
            for row in result.rows::<ColdRow>()? {
                rows.push(row?);
            }
        }
        rows.sort_by_key(|r| r.0);
        Ok(rows)
    }

    /// At most `limit` archived rows of `conversation` with `from <= seq <= to`, from the
    /// `start` end of the range: one query per bucket, newest or oldest bucket first,
    /// until `limit` rows are found.
    pub async fn page(
        &self,
        conversation: i64,
        from: i64,
        to: i64,
        start: Start,
        limit: usize,
    ) -> anyhow::Result<Vec<ColdRow>> {
        let mut rows = Vec::new();
        if from > to || limit == 0 {
            return Ok(rows);
        }
        let (first, last) = (self.settings.bucket(from), self.settings.bucket(to));
        let buckets: Vec<i64> = match start {
            Start::Newest => (first..=last).rev().collect(),
            Start::Oldest => (first..=last).collect(),
        };
        let statement = match start {
            Start::Newest => &self.select_newest,
            Start::Oldest => &self.select_oldest,
        };
        for bucket in buckets {
            let want = (limit - rows.len()) as i32;
            let result = self
                .session
                .execute_unpaged(statement, (conversation, bucket, from, to, want))
                .await?
                .into_rows_result()?;
            for row in result.rows::<ColdRow>()? {
                rows.push(row?);
            }
            if rows.len() >= limit {
                break;
            }
        }
        Ok(rows)
    }
}

/// The archive's bucket size is fixed when it is first written: a process configured
/// otherwise would look for messages in the wrong partitions.
async fn check_bucket_size(
    session: &Session,
    settings: &StorageSettings,
    schema: Schema,
) -> anyhow::Result<()> {
    let ks = &settings.keyspace;
    if schema == Schema::Make {
        session
            .query_unpaged(
                format!(
                    "INSERT INTO {ks}.archive_settings (name, value) VALUES ('bucket_size', ?) IF NOT EXISTS"
                ),
                (settings.bucket_size,),
            )
            .await
            .context("recording the archive's bucket size")?;
    }
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

/// The values of one change's statement: the three statements bind different columns,
/// and a batch holds any mix of them.
enum ChangeValues<'a> {
    New(
        (
            i64,
            i64,
            i64,
            i64,
            uuid::Uuid,
            &'a str,
            i64,
            Option<i64>,
            i64,
        ),
    ),
    Edited((i64, i64, &'a str, i64, i64, i64, i64)),
    Deleted((i64, i64, i64, i64, i64, i64, i64)),
}

impl SerializeRow for ChangeValues<'_> {
    fn serialize(
        &self,
        ctx: &RowSerializationContext<'_>,
        writer: &mut RowWriter,
    ) -> Result<(), SerializationError> {
        match self {
            Self::New(v) => v.serialize(ctx, writer),
            Self::Edited(v) => v.serialize(ctx, writer),
            Self::Deleted(v) => v.serialize(ctx, writer),
        }
    }

    fn is_empty(&self) -> bool {
        false
    }
}
