//! ingest-api settings: `config/ingest-api.toml` (compiled in), an optional file, then
//! the environment. See that file for what each key means.

use std::net::SocketAddr;
use std::path::Path;

use figment::providers::Format;
use std::time::Duration;

use chatpipe_core::auth::AuthSettings;
use chatpipe_core::config::{OutboxSettings, RegistrySettings};
use secrecy::SecretString;
use serde::Deserialize;

const DEFAULTS: &str = include_str!("../../config/ingest-api.toml");

/// Well-known variables that override a key directly.
pub const ALIASES: &[(&str, &str)] = &[
    ("DATABASE_URL", "database.url"),
    ("JWT_SECRET", "auth.jwt_secret"),
    ("INGEST_ADDR", "http.addr"),
    ("INGEST_ADMIN_ADDR", "admin.addr"),
    ("SCHEMA_REGISTRY_URL", "registry.url"),
    ("KAFKA_BROKERS", "kafka.brokers"),
    ("CASSANDRA_NODES", "storage.cassandra_nodes"),
    (
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "telemetry.otlp_endpoint",
    ),
];

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    pub http: HttpSettings,
    pub admin: chatpipe_core::config::AdminSettings,
    pub database: DatabaseSettings,
    pub auth: AuthSettings,
    pub limits: Limits,
    pub sync: SyncBounds,
    pub registry: RegistrySettings,
    pub outbox: OutboxSettings,
    pub reads: ReadSettings,
    pub kafka: KafkaSettings,
    pub sends: SendSettings,
    pub membership: MembershipSettings,
    pub rate_limits: RateLimitSettings,
    pub demo: DemoSettings,
    /// The cold tier, where history finds archived messages.
    pub storage: chatpipe_core::cold::StorageSettings,
    /// Where spans go (unset: nowhere).
    #[serde(default)]
    pub telemetry: chatpipe_core::telemetry::TelemetrySettings,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReadMode {
    Stream,
    Direct,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReadSettings {
    pub mode: ReadMode,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaSettings {
    pub brokers: String,
    pub receipts_topic: String,
    /// Delivery acks (`POST /conversations/{id}/delivered` in stream mode).
    pub acks_topic: String,
    pub produce_timeout_ms: u64,
    pub queue_max_messages: u32,
    /// How long the receipt producer waits to fill a batch (librdkafka `linger.ms`).
    pub linger_ms: u64,
    /// librdkafka properties for a secured cluster (TLS, SASL): see
    /// `chatpipe_core::kafka::apply`.
    #[serde(default)]
    pub properties: chatpipe_core::kafka::Properties,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpSettings {
    pub addr: SocketAddr,
    pub request_timeout_ms: u64,
    pub max_request_bytes: usize,
    pub shutdown_grace_ms: u64,
    pub header_read_timeout_ms: u64,
    pub max_connections: usize,
    pub max_connections_per_ip: usize,
    pub refusing_at_once: usize,
    /// Origins a browser may call the API from (CORS); empty: none but the API's own.
    pub cors_allowed_origins: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatabaseSettings {
    /// No default: a login role of chatpipe_service (docs/operations.md).
    #[serde(default = "chatpipe_core::db::no_url")]
    pub url: SecretString,
    pub max_connections: u32,
    pub min_connections: u32,
    pub acquire_timeout_ms: u64,
    pub statement_timeout_ms: u64,
    pub synchronous_commit: chatpipe_core::db::SynchronousCommit,
    pub migrate_on_start: bool,
}

/// Request-level limits every handler validates against.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    pub max_body_chars: usize,
    pub max_group_members: usize,
    pub max_title_chars: usize,
    pub max_reaction_keys: i64,
    pub max_mentions: usize,
    pub max_mention_all_members: usize,
    pub default_page_limit: i64,
    pub max_page_limit: i64,
    pub preview_chars: usize,
    /// The longest `Idempotency-Key` accepted.
    pub max_idempotency_key_chars: usize,
    /// How long an `Idempotency-Key` is remembered.
    pub idempotency_key_retention_s: u64,
}

impl Settings {
    pub fn load(file: Option<&Path>) -> Result<Self, Box<figment::Error>> {
        chatpipe_core::config::load(DEFAULTS, file, ALIASES)
    }

    /// The compiled-in defaults alone, plus a secret: no file, no environment. Tests
    /// start from here and set what they need.
    pub fn defaults_with_secret(secret: &str) -> Self {
        figment::Figment::from(figment::providers::Toml::string(DEFAULTS))
            .merge(("auth.jwt_secret", secret))
            .extract()
            .expect("the compiled-in defaults file is valid")
    }
}

impl HttpSettings {
    pub fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.request_timeout_ms)
    }

    pub fn connection_limits(&self) -> chatpipe_core::http::ConnectionLimits {
        chatpipe_core::http::ConnectionLimits {
            header_read_timeout_ms: self.header_read_timeout_ms,
            max_connections: self.max_connections,
            max_connections_per_ip: self.max_connections_per_ip,
            refusing_at_once: self.refusing_at_once,
        }
    }
}

/// How much one sync answer holds (`[sync]` in `config/ingest-api.toml`).
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SyncBounds {
    /// Conversations per answer, those left included.
    pub max_conversations: usize,
    /// Bytes of message bodies per answer; an answer holds at least one message.
    pub max_bytes: usize,
}

/// `[sends]` in the config.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SendSettings {
    /// Most messages one statement writes.
    pub max_batch: usize,
    /// Most sends waiting in one conversation's lane; more answer 503.
    pub max_queued: usize,
    /// Most send statements in flight at once (each holds a pooled connection).
    pub max_writers: usize,
}

/// `[membership]` in the config.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MembershipSettings {
    /// (conversation, member) pairs remembered (`member_cache_entries`).
    pub cache_max_entries: usize,
    /// How long a pair is trusted before PostgreSQL is asked again.
    pub cache_ttl_ms: u64,
}

/// One bucket: `rate` requests per `per_secs` seconds, at most `burst` at once.
/// `rate = 0` turns the limit off.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Bucket {
    pub rate: u32,
    pub per_secs: u32,
    pub burst: u32,
}

impl Bucket {
    /// No limit (`rate = 0`).
    pub const OFF: Bucket = Bucket {
        rate: 0,
        per_secs: 1,
        burst: 0,
    };
}

/// `[rate_limits]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimitSettings {
    /// `POST /conversations/{id}/messages`.
    pub sends: Bucket,
    /// `POST /conversations` and `POST /direct`.
    pub creates: Bucket,
    /// Adding and removing members (leaving included), and blocks.
    pub member_changes: Bucket,
    /// Users one user adds to groups, creating them included: each added user takes a
    /// token, so nobody puts strangers in groups faster than this.
    pub members_added: Bucket,
    /// What reads or marks read: history, inbox, sync, members, receipts, `/read` and
    /// `/delivered`.
    pub reads: Bucket,
    /// How often users with full buckets are forgotten.
    pub sweep_interval_ms: u64,
}

/// `[demo]` in the config.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DemoSettings {
    /// Serve `/app` and `/demo/*`.
    pub enabled: bool,
    /// The gateway's WebSocket URL, as a browser reaches it (the app connects there).
    pub gateway_url: String,
    /// Lifetime of a demo token, [`crate::routes::demo::MAX_TOKEN_TTL_SECS`] at most.
    pub token_ttl_secs: u64,
    /// Allow demo mode on an `http.addr` that is not loopback (refused at start
    /// otherwise): only where nobody but the people trying it can reach the API.
    #[serde(default)]
    pub allow_remote: bool,
    /// Demo tokens handed out, per `per_secs` seconds, to everyone together.
    pub tokens: Bucket,
    /// Serve the app's files from this folder, read on each request (for working on
    /// the app: edit, reload); unset, the copies compiled into the binary.
    #[serde(default)]
    pub app_dir: Option<std::path::PathBuf>,
}
