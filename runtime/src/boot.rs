//! Starting a reader: the one way every reader thread of a processor begins.
//!
//! A reader thread owns a runtime of its own ([`crate::reader_runtime`]), the registry,
//! the Kafka client configuration and the health it reports. It first gathers what its
//! processor needs (codecs, a database pool), waiting out outages; then it runs the
//! processor in a [`Reader`] until the process stops:
//!
//! ```ignore
//! let thread = ReaderThread::new(settings.kafka.client(), registry, health, &settings.readers)?;
//! let Some((codec, pool)) = thread.start(stop, "receipts-0: starting", || async { … }) else {
//!     return Ok(()); // stopped while waiting
//! };
//! thread.run(spec, Receipts { handle: thread.handle(), codec, pool, … }, stop)
//! ```

use std::future::Future;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

use chatpipe_schemas::registry::Registry;
use rdkafka::ClientConfig;

use crate::health::ReaderHealth;
use crate::reader::{Processor, Reader, ReaderSpec};
use crate::retry::{retry_until, ReaderSettings};
use crate::schemas::WriterSchemas;

/// What a reader thread holds before its processor exists.
pub struct ReaderThread {
    runtime: tokio::runtime::Runtime,
    registry: Registry,
    client: ClientConfig,
    health: Arc<ReaderHealth>,
    settings: ReaderSettings,
}

impl ReaderThread {
    /// A thread's runtime, and what its reader will be made with: `client` (the
    /// service's Kafka client configuration), `registry`, and the `health` it reports.
    pub fn new(
        client: ClientConfig,
        registry: Registry,
        health: Arc<ReaderHealth>,
        settings: &ReaderSettings,
    ) -> std::io::Result<Self> {
        Ok(Self {
            runtime: crate::reader_runtime()?,
            registry,
            client,
            health,
            settings: settings.clone(),
        })
    }

    /// The thread's runtime, for the processor's async calls (database, producers).
    pub fn handle(&self) -> tokio::runtime::Handle {
        self.runtime.handle().clone()
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    pub fn health(&self) -> &Arc<ReaderHealth> {
        &self.health
    }

    /// Runs `attempt` on the thread's runtime until it succeeds, waiting with backoff
    /// between failures (a processor starting while the registry, the broker or the
    /// database is down waits for it). `None` if `stop` was set first.
    pub fn start<T, F>(
        &self,
        stop: &CancellationToken,
        what: &str,
        mut attempt: impl FnMut() -> F,
    ) -> Option<T>
    where
        F: Future<Output = anyhow::Result<T>>,
    {
        retry_until(stop, &self.settings, what, || {
            self.runtime.block_on(attempt())
        })
    }

    /// The reader of `spec` with `processor` in it, consuming (subscribed or assigned)
    /// but not polled yet: for a processor that looks at the consumer first.
    pub fn reader<P: Processor>(
        &self,
        spec: ReaderSpec,
        processor: P,
    ) -> anyhow::Result<Reader<P>> {
        Reader::new(
            spec,
            self.client.clone(),
            processor,
            WriterSchemas::new(self.registry.clone(), self.handle()),
            self.health.clone(),
        )
    }

    /// Makes the reader of `spec` with `processor` in it and runs it until `stop`.
    pub fn run<P: Processor>(
        self,
        spec: ReaderSpec,
        processor: P,
        stop: &CancellationToken,
    ) -> anyhow::Result<()> {
        self.reader(spec, processor)?.run(stop)
    }
}
