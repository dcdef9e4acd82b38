//! The processor runtime: what every reader of chatpipe (the receipts aggregator, fanout
//! and its presence table, the gateway's deliveries) runs on.
//!
//! - [`boot`]: a reader thread, from gathering what its processor needs to running it.
//! - [`reader`]: the consumer shell. A [`Processor`] (state + side effect) plugs into
//!   it; the shell decodes, applies, dead-letters poison, commits after the side
//!   effect, and holds its position through outages, retrying with backoff.
//! - [`failure`]: the line between retriable and poison.
//! - [`schemas`]: writer schemas by id, registry answers classified.
//! - [`health`]: stalled readers, for `/readyz` and `<reader>_consumer_stalled`.
//! - [`supervisor`]: a task that dies takes the process down with it, loudly.
//! - [`http`]: `/healthz`, `/readyz`, `/metrics`.

pub mod boot;
pub mod dead_letter;
pub mod failure;
pub mod health;
pub mod http;
pub mod reader;
pub mod retry;
pub mod schemas;
pub mod supervisor;

pub use boot::ReaderThread;
pub use failure::Failure;
pub use health::{ReaderHealth, Readiness};
pub use reader::{Position, Processor, Reader, ReaderSpec, Source};
pub use retry::{retry_until, ReaderSettings};
pub use schemas::{Decode, WriterSchemas};
pub use supervisor::Supervisor;
/// How a process tells its tasks to stop: on SIGTERM, or when one of them failed.
pub use tokio_util::sync::CancellationToken;

/// The runtime a reader thread blocks on for its async calls (database, registry,
/// dead-letter acks). One worker thread drives its IO, so a Kafka callback inside `poll`
/// can `block_on` through a [`tokio::runtime::Handle`] (a current-thread runtime would
/// not drive IO there and the call would never finish).
pub fn reader_runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
}
