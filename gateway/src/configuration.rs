//! The gateway's settings (`config/gateway.toml`, overridden by `CHATPIPE_<SECTION>__<KEY>`
//! and the aliases below).

use std::net::SocketAddr;
use std::path::Path;

use chatpipe_core::auth::AuthSettings;
use chatpipe_core::config::{KafkaSettings, RegistrySettings};
use chatpipe_runtime::ReaderSettings;
use serde::Deserialize;

use crate::signals;

const DEFAULTS: &str = include_str!("../../config/gateway.toml");
pub const ALIASES: &[(&str, &str)] = &[
    ("GATEWAY_ADDR", "http.addr"),
    ("GATEWAY_ADMIN_ADDR", "admin.addr"),
    ("GATEWAY_ID", "gateway.id"),
    ("JWT_SECRET", "auth.jwt_secret"),
    ("KAFKA_BROKERS", "kafka.brokers"),
    ("SCHEMA_REGISTRY_URL", "registry.url"),
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
    pub gateway: GatewaySettings,
    pub auth: AuthSettings,
    pub sessions: SessionSettings,
    pub kafka: KafkaSettings,
    pub registry: RegistrySettings,
    pub presence: PresenceSettings,
    pub deliveries: DeliveriesSettings,
    pub signals: SignalSettings,
    pub readers: ReaderSettings,
    /// Where spans go (unset: nowhere).
    #[serde(default)]
    pub telemetry: chatpipe_core::telemetry::TelemetrySettings,
}

/// Where what clients say over the socket goes (`signals.rs`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignalSettings {
    /// `ack` frames (delivered ticks): `chat.delivery-acks`.
    pub acks_topic: String,
    /// `typing` frames: `chat.ephemeral`.
    pub ephemeral_topic: String,
    /// At most one typing signal per conversation per this long leaves a connection
    /// (fanout throttles per user to its own interval).
    pub typing_interval_ms: u64,
    /// How long a signal may wait for the broker before it is given up (acks are
    /// cumulative: the next covers it; typing late is worth nothing).
    pub produce_timeout_ms: u64,
    /// Text frames one connection may send: past it, it is closed (1008 "too many frames").
    pub frames: signals::FrameBucket,
    /// A conversation's acks leave a connection at most once per this long, the highest
    /// seq of those held back.
    pub ack_interval_ms: u64,
    /// Signals waiting for the broker, all connections together (the producer's queue):
    /// past it, new ones are dropped (gateway_acks_total{result="dropped"}).
    pub queue_max_messages: u32,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GatewaySettings {
    pub id: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PresenceSettings {
    pub topic: String,
    pub lease_ms: u64,
    pub renew_ms: u64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeliveriesSettings {
    pub topic: String,
    pub partition: i32,
    pub max_pending_lists: usize,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpSettings {
    pub addr: SocketAddr,
    pub header_read_timeout_ms: u64,
    pub max_connections: usize,
    pub max_connections_per_ip: usize,
    pub refusing_at_once: usize,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionSettings {
    pub queue_bound: usize,
    pub heartbeat_ms: u64,
    pub socket_send_buffer_bytes: u32,
    pub read_buffer_bytes: usize,
    pub max_client_message_bytes: usize,
    pub max_sessions: usize,
    pub max_sessions_per_user: usize,
}

impl Settings {
    pub fn load(file: Option<&Path>) -> Result<Self, Box<figment::Error>> {
        chatpipe_core::config::load(DEFAULTS, file, ALIASES)
    }
}
