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
];

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    pub http: HttpSettings,
    pub admin: chatpipe_core::config::AdminSettings,
    pub database: DatabaseSettings,
    pub auth: AuthSettings,
    pub limits: Limits,
    pub sync: crate::store::sync::SyncBounds,
    pub registry: RegistrySettings,
    pub outbox: OutboxSettings,
    pub reads: ReadSettings,
    pub kafka: KafkaSettings,
    pub sends: crate::store::send::SendSettings,
    pub membership: crate::store::members::MembershipSettings,
    pub rate_limits: crate::rate::RateLimitSettings,
    pub demo: crate::routes::demo::DemoSettings,
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
    pub default_page_limit: i64,
    pub max_page_limit: i64,
    pub preview_chars: usize,
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
