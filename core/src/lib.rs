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

/// Every chatpipe process (the services, the tools, the tests) allocates with mimalloc: in
/// a profile of the read storm glibc's malloc and free took about 5% of the machine's CPU,
/// spread over the API's request path, the Kafka client and the JSON bodies
/// (`docs/benchmarks.md` has the before and after).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

pub use chatpipe_schemas::ids;
pub use ids::{ConversationId, Seq, UserId, Watermark};
