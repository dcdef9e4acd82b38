//! What the auditor's checks read, as the report shows it: [`Checker`](super::checks::Checker)
//! fills these in (I/O), [`judge`](super::judge) decides what they mean (no I/O).

use std::collections::BTreeMap;

use chatpipe_schemas::ConversationId;
use chrono::{DateTime, Utc};
use serde::Serialize;

use super::cluster::Replication;
use super::keeper::KeeperReport;
use super::outbox::Backlog;
use super::topology::TopologyReport;

/// The latest results, for `/report`.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Latest {
    pub checked_at: Option<DateTime<Utc>>,
    pub cdc: Cdc,
    /// `None`: PostgreSQL did not answer (see `postgres_unreachable`).
    pub slot: Option<Slot>,
    pub connector: Option<Connector>,
    pub probes: Vec<Probe>,
    /// End offset (records ever written) of each dead-letter topic.
    pub dead_letters: BTreeMap<String, i64>,
    /// The watched topics' partitions; `None`: the cluster did not answer.
    pub replication: Option<Replication>,
    /// What is left in the outbox (`outbox.retain_until_confirmed`).
    pub outbox: Option<Backlog>,
    /// The primary and its standbys (`audit.postgres_nodes`).
    pub topology: Option<TopologyReport>,
    /// The archiver's lag (`audit.archive_group`).
    pub archive: Option<super::archive::ArchiveLag>,
}

#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Cdc {
    /// The auditor has read `chat.events` to its end (its own lag is 0).
    pub caught_up: bool,
    pub auditor_lag: i64,
    /// Conversations compared with PostgreSQL in the last check.
    pub sampled: usize,
    /// Commits seen in PostgreSQL and not yet on `chat.events`.
    pub unstreamed: usize,
    pub oldest_unstreamed_ms: u64,
    pub newest_conversation_in_postgres: Option<i64>,
    pub newest_conversation_streamed: Option<ConversationId>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Slot {
    pub name: String,
    /// `false` also when the slot does not exist.
    pub exists: bool,
    pub active: bool,
    pub retained_wal_bytes: i64,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Connector {
    pub name: String,
    /// The connector and every task RUNNING.
    pub running: bool,
    /// The connector's state and each task's, or why Connect did not say.
    pub state: String,
    pub tasks: Vec<String>,
    /// The connector or a task is FAILED: what the keeper restarts.
    pub failed: bool,
    /// The first line of a FAILED one's error (Connect's `trace`).
    pub error: Option<String>,
    pub keeper: KeeperReport,
    /// The worker running the first task (`host:port`), when it runs.
    pub worker: Option<String>,
    /// How often the task changed workers within `audit.task_moves_window_ms`.
    pub task_moves: usize,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Probe {
    pub url: String,
    pub ok: bool,
    /// The HTTP status, or the error.
    pub answer: String,
    pub failing_ms: u64,
}
