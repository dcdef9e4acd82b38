use std::path::Path;

use chatpipe_core::config::{KafkaSettings, OutboxSettings, RegistrySettings};
use serde::Deserialize;

const DEFAULTS: &str = include_str!("../../config/pipeline.toml");

pub const ALIASES: &[(&str, &str)] = &[
    ("KAFKA_BROKERS", "kafka.brokers"),
    ("SCHEMA_REGISTRY_URL", "registry.url"),
    ("DATABASE_URL", "database.url"),
    ("CASSANDRA_NODES", "storage.cassandra_nodes"),
    (
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "telemetry.otlp_endpoint",
    ),
];

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    pub kafka: KafkaSettings,
    pub registry: RegistrySettings,
    pub database: DatabaseSettings,
    pub outbox: OutboxSettings,
    pub receipts: ReceiptsSettings,
    pub fanout: FanoutSettings,
    pub audit: AuditSettings,
    pub archive: ArchiveSettings,
    pub notifications: NotificationSettings,
    pub analytics: AnalyticsSettings,
    pub storage: chatpipe_core::cold::StorageSettings,
    pub http: HttpSettings,
    pub fault: FaultSettings,
    pub readers: chatpipe_runtime::ReaderSettings,
    /// Where spans go (unset: nowhere).
    #[serde(default)]
    pub telemetry: chatpipe_core::telemetry::TelemetrySettings,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatabaseSettings {
    /// No default: a login role of chatpipe_service (docs/operations.md).
    #[serde(default = "chatpipe_core::db::no_url")]
    pub url: secrecy::SecretString,
    pub max_connections: u32,
    pub acquire_timeout_ms: u64,
    pub synchronous_commit: chatpipe_core::db::SynchronousCommit,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReceiptsSettings {
    pub topic: String,
    pub group: String,
    /// Delivery acks (`chat.delivery-acks`), read by readers of their own in this group.
    pub acks_topic: String,
    pub acks_group: String,
    pub debounce_window_ms: u64,
    /// A window also flushes once no receipt came for this long (0: never).
    pub quiet_flush_ms: u64,
    pub max_batch_keys: usize,
    pub max_poll_ms: u64,
    pub concurrency: usize,
    /// The broker answers a receipts reader's fetch once it holds this many bytes for
    /// it, or after `fetch_wait_max_ms` (librdkafka's `fetch.min.bytes` and
    /// `fetch.wait.max.ms`): the window batches anyway, so fewer, fuller fetches.
    pub fetch_min_bytes: u32,
    pub fetch_wait_max_ms: u64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FanoutSettings {
    pub events_topic: String,
    pub group: String,
    /// Typing signals from the gateways (`chat.ephemeral`), read in a group of their own.
    pub ephemeral_topic: String,
    pub typing_group: String,
    /// At most one typing push per (conversation, user) this often.
    pub typing_throttle_ms: u64,
    /// A typing signal older than this is dropped; clients show typing this long.
    pub typing_expiry_ms: u64,
    /// How long the typing reader trusts the members it read from PostgreSQL.
    pub typing_members_ttl_ms: u64,
    /// Conversations whose members the typing reader may read from PostgreSQL per
    /// second; a signal for one not cached past it is dropped ("membership_budget").
    pub typing_member_loads_per_sec: u32,
    pub presence_topic: String,
    pub deliveries_topic: String,
    pub light_threshold: usize,
    pub tick_ms: u64,
    pub max_poll_ms: u64,
    pub max_age_ms: u64,
    pub presence_forget_ms: u64,
    pub produce_queue_max: usize,
    pub changelog_topic: String,
    pub max_cached_conversations: usize,
    /// Member ids kept in memory over all conversations (`fanout_cached_members`).
    pub max_cached_members: usize,
}

/// `pipeline archive`: see `[archive]` in config/pipeline.toml.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArchiveSettings {
    pub events_topic: String,
    pub group: String,
    /// A batch is written once it holds this many changes...
    pub max_batch: usize,
    /// ...or this long after its first record.
    pub linger_ms: u64,
    /// Cassandra writes in flight per reader.
    pub write_concurrency: usize,
    /// The changes of one Cassandra partition in one write, at most this many.
    pub rows_per_write: usize,
    pub max_poll_ms: u64,
    pub concurrency: usize,
    /// The retention step: a round this often...
    pub retention_interval_ms: u64,
    /// ...over at most this many due conversations...
    pub retention_conversations: usize,
    /// ...moving at most this many rows of each per sweep.
    pub retention_batch: usize,
    /// A row Cassandra's copy differs from is looked at again this much later.
    pub retention_retry_ms: u64,
}

/// `pipeline notifications`: see `[notifications]` in config/pipeline.toml.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NotificationSettings {
    pub events_topic: String,
    pub group: String,
    /// Where the notifications go (`chat.notifications`, keyed by user id).
    pub topic: String,
    /// A conversation's new messages wait this long from the first, then go out as one
    /// notification per member.
    pub collapse_ms: u64,
    /// Conversations with messages waiting, at most; past it the oldest go out early.
    pub max_open_windows: usize,
    /// Characters of the newest message's body in a notification (0: no preview).
    pub preview_chars: usize,
    /// Messages older than this are not told (a replay after a long outage).
    pub max_age_ms: u64,
    pub max_poll_ms: u64,
}

/// `pipeline analytics`: see `[analytics]` in config/pipeline.toml.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AnalyticsSettings {
    pub events_topic: String,
    pub group: String,
    pub messages_topic: String,
    pub reads_topic: String,
    pub deliveries_topic: String,
    pub membership_topic: String,
    /// Records are written and acknowledged in batches of at most this many rows...
    pub max_batch: usize,
    /// ...or after this long from the batch's first record.
    pub linger_ms: u64,
    /// Members whose watermark the processor remembers (for `fromSeq`).
    pub max_tracked_watermarks: usize,
    pub max_poll_ms: u64,
}

/// `pipeline audit`: see `[audit]` in config/pipeline.toml.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditSettings {
    pub events_topic: String,
    pub group: String,
    pub max_poll_ms: u64,
    pub check_interval_ms: u64,
    pub max_tracked_conversations: usize,
    pub max_tracked_members: usize,
    pub cdc_sample: usize,
    pub cdc_lag_alert_ms: u64,
    pub connect_url: String,
    pub connector: String,
    pub connector_alert_ms: u64,
    pub connector_restart: bool,
    pub connector_restart_backoff_ms: u64,
    pub connector_restart_max_backoff_ms: u64,
    pub slot: String,
    pub slot_inactive_alert_ms: u64,
    pub slot_retained_wal_alert_bytes: i64,
    pub probes: Vec<String>,
    pub probe_timeout_ms: u64,
    pub probe_alert_ms: u64,
    pub dead_letter_topics: Vec<String>,
    pub replicated_topics: Vec<String>,
    pub under_replicated_alert_ms: u64,
    pub offline_alert_ms: u64,
    pub task_moves_alert: usize,
    pub task_moves_window_ms: u64,
    pub event_alarm_ms: u64,
    pub recent: usize,
    pub outbox_confirm_batch: usize,
    pub outbox_confirm_interval_ms: u64,
    pub outbox_unconfirmed_alert_ms: u64,
    pub postgres_nodes: Vec<String>,
    pub standby_down_alert_ms: u64,
    pub standby_lag_alert_bytes: i64,
    pub standby_lag_alert_ms: u64,
    pub slot_sync_alert_ms: u64,
    /// The archiver's consumer group; empty: no archiver runs, nothing to watch.
    pub archive_group: String,
    pub archive_lag_alert_ms: u64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpSettings {
    pub metrics_addr: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultSettings {
    pub kill_after_db_commit: bool,
}

impl DatabaseSettings {
    /// A pool of `max_connections` to `url`, connected now (so a wrong URL fails at start).
    pub async fn connect(&self) -> anyhow::Result<sqlx::PgPool> {
        use anyhow::Context;
        self.pool_options()
            .connect_with(self.connect_options()?)
            .await
            .context("connecting to PostgreSQL (database.url / DATABASE_URL)")
    }

    /// The same pool, connecting on first use: PostgreSQL being down at start is then a
    /// finding of the caller's, not a reason to exit.
    pub fn connect_lazy(&self) -> anyhow::Result<sqlx::PgPool> {
        Ok(self
            .pool_options()
            .connect_lazy_with(self.connect_options()?))
    }

    /// Every connection commits durably: the receipts processor commits its offsets
    /// after a flush's COMMIT, so a flush lost in a crash would never be replayed.
    fn connect_options(&self) -> anyhow::Result<sqlx::postgres::PgConnectOptions> {
        let options = chatpipe_core::db::connect_options(&self.url, "pipeline")?;
        Ok(self.synchronous_commit.apply(options))
    }

    fn pool_options(&self) -> sqlx::postgres::PgPoolOptions {
        sqlx::postgres::PgPoolOptions::new()
            .max_connections(self.max_connections)
            .acquire_timeout(std::time::Duration::from_millis(self.acquire_timeout_ms))
    }
}

impl Settings {
    /// A client of the schema registry (`[registry]`).
    pub fn registry_client(&self) -> anyhow::Result<chatpipe_schemas::registry::Registry> {
        Ok(self.registry.connect()?)
    }

    /// A reader thread of this process (its runtime, the registry, `[kafka]` and
    /// `[readers]`), reporting to `health`.
    pub fn reader_thread(
        &self,
        health: std::sync::Arc<chatpipe_runtime::ReaderHealth>,
    ) -> anyhow::Result<chatpipe_runtime::ReaderThread> {
        self.reader_thread_with(self.kafka.client(), health)
    }

    /// [`Self::reader_thread`] with its consumer configured from `client`.
    pub fn reader_thread_with(
        &self,
        client: rdkafka::ClientConfig,
        health: std::sync::Arc<chatpipe_runtime::ReaderHealth>,
    ) -> anyhow::Result<chatpipe_runtime::ReaderThread> {
        Ok(chatpipe_runtime::ReaderThread::new(
            client,
            self.registry_client()?,
            health,
            &self.readers,
        )?)
    }

    pub fn load(file: Option<&Path>) -> Result<Self, Box<figment::Error>> {
        chatpipe_core::config::load(DEFAULTS, file, ALIASES)
    }
}
