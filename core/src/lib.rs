//! What every chatpipe service shares: the domain ids, JWT auth, layered config,
//! telemetry, the Prometheus recorder and the `application/problem+json` error body.

pub mod auth;
pub mod catalogue;
pub mod cold;
pub mod config;
pub mod db;
pub mod http;
pub mod kafka;
pub mod outbox;
pub mod problem;
pub mod redact;
pub mod startup;
pub mod telemetry;
pub mod watermark;

pub use chatpipe_schemas::ids;
pub use ids::{ConversationId, Seq, UserId, Watermark};
