//! What every chatpipe service shares: the domain ids, JWT auth, layered config,
//! telemetry, the Prometheus recorder and the `application/problem+json` error body.

pub mod auth;
pub mod config;
pub mod ids;
pub mod kafka;
pub mod outbox;
pub mod problem;
pub mod telemetry;
pub mod watermark;

pub use ids::{ConversationId, Seq, UserId};
