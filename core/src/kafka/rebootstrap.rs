//! Every Kafka client of ours keeps a broker to ask, whatever a metadata response says.
//!
//! **The defect** ([librdkafka#5301], open; in every release from 2.10 to 2.15, and in
//! the 2.12.1 that rdkafka 0.39 bundles). Since 2.10 a client drops each broker that a
//! metadata response does not list, and the bootstrap brokers with them once it has
//! learned one (`rd_kafka_metadata_decommission_unavailable_brokers`). It refuses a
//! response with no brokers *and* no topics, but takes one with no brokers and some
//! topics. A KRaft broker sends just that while it is fenced: after a stall longer than
//! `broker.session.timeout.ms`, and for a moment after a restart, before the
//! controller's unfencing reaches its own metadata cache. Its Metadata response then
//! reads "0 brokers, 1 topics", every leader -1 (seen on our stack with `debug=metadata`,
//! see docs/operations.md). A client that gets it while it has a learned broker drops
//! every broker it has; only the logical ones (the group coordinator) are left. The
//! response counted as a success, so the re-bootstrap timer is stopped too. From then
//! on every metadata request fails with a transport error ("no usable brokers"), every
//! assigned partition is unknown to the client, and a new client of the same broker is
//! served at once. It ends only by chance (a later "all brokers down" may re-bootstrap)
//! or never: the broker-restart test saw 33–60 s, the drill a gateway that never pushed
//! again.
//!
//! **The remedy**, until the upstream fix (librdkafka#5303) is released and bundled:
//! every client reports its statistics each second (`statistics.interval.ms`); when they
//! list no broker it learned or was configured with, the client is given its
//! `bootstrap.servers` again (`rd_kafka_brokers_add`), which is what librdkafka's own
//! re-bootstrap does. A client that has no learned broker never drops its bootstrap
//! ones, so the next metadata response, fenced or not, cannot strand it again. Each such
//! rescue is counted (`kafka_rebootstraps_total`) and logged.
//!
//! Every client is made through [`create`] or [`create_with`], so no client goes
//! without it; `clippy.toml` refuses `ClientConfig::create` elsewhere.
//!
//! [librdkafka#5301]: https://github.com/confluentinc/librdkafka/issues/5301

use std::ffi::CString;
use std::sync::{Arc, OnceLock};

use rdkafka::admin::AdminClient;
use rdkafka::bindings::{rd_kafka_brokers_add, rd_kafka_t, rd_kafka_type, rd_kafka_type_t};
use rdkafka::client::ClientContext;
use rdkafka::config::FromClientConfigAndContext;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, StreamConsumer};
use rdkafka::error::KafkaResult;
use rdkafka::producer::{
    BaseProducer, DeliveryResult, FutureProducer, NoCustomPartitioner, Producer, ProducerContext,
    ThreadedProducer,
};
use rdkafka::{ClientConfig, Statistics};

/// How often a client reports its statistics unless its config says otherwise: how long
/// a stranded client waits at most before it is given its bootstrap servers again.
pub const STATISTICS_INTERVAL_MS: &str = "1000";

/// One client's guard: its bootstrap servers and, once it exists, the client itself.
/// Cheap to clone; the client's context holds one and feeds it the statistics.
#[derive(Clone)]
pub struct Rebootstrap {
    inner: Arc<Inner>,
}

struct Inner {
    servers: CString,
    client: OnceLock<Native>,
}

/// The librdkafka handle of the client this guard belongs to.
struct Native(*mut rd_kafka_t);

// SAFETY: librdkafka's API is thread-safe, and the handle is used only from the
// client's own statistics callback, which librdkafka runs only while the client exists
// (from a poll of it), so the handle is never used after `rd_kafka_destroy`.
unsafe impl Send for Native {}
unsafe impl Sync for Native {}

impl Rebootstrap {
    fn new(servers: &str) -> Self {
        Self {
            inner: Arc::new(Inner {
                // A broker list holds no NUL; librdkafka would have refused it.
                servers: CString::new(servers).unwrap_or_default(),
                client: OnceLock::new(),
            }),
        }
    }

    /// Called from the client's statistics callback: a client left without a broker is
    /// given its bootstrap servers again. Returns whether it was.
    pub fn observe(&self, stats: &Statistics) -> bool {
        if has_broker(stats.brokers.values().map(|b| b.source.as_str())) {
            return false;
        }
        let Some(native) = self.inner.client.get() else {
            return false;
        };
        // SAFETY: see `Native`; the list is a NUL-terminated string librdkafka copies.
        let added = unsafe { rd_kafka_brokers_add(native.0, self.inner.servers.as_ptr()) };
        metrics::counter!("kafka_rebootstraps_total", "client" => stats.client_type.clone())
            .increment(1);
        tracing::warn!(
            client = %stats.name,
            servers = ?self.inner.servers,
            added,
            "the Kafka client had no broker left (librdkafka#5301: a metadata response that listed none): its bootstrap servers are added again"
        );
        true
    }
}

/// Whether a client whose brokers have these `source`s (from its statistics) has one it
/// can send a request to: one it learned from metadata or was configured with; `logical`
/// (coordinator) and `internal` brokers are no such broker.
fn has_broker<'a>(sources: impl IntoIterator<Item = &'a str>) -> bool {
    sources
        .into_iter()
        .any(|s| s == "learned" || s == "configured")
}

/// The context of a client that needs nothing else of one: it only guards the client.
pub struct Guarded(pub Rebootstrap);

impl ClientContext for Guarded {
    fn stats(&self, statistics: Statistics) {
        self.0.observe(&statistics);
    }
}

impl ConsumerContext for Guarded {}

impl ProducerContext for Guarded {
    type DeliveryOpaque = ();
    fn delivery(&self, _: &DeliveryResult<'_>, _: Self::DeliveryOpaque) {}
}

/// A client type whose librdkafka handle can be had (every consumer and producer).
pub trait NativeClient {
    fn native(&self) -> *mut rd_kafka_t;
}

impl<C: ConsumerContext + 'static> NativeClient for BaseConsumer<C> {
    fn native(&self) -> *mut rd_kafka_t {
        Consumer::client(self).native_ptr()
    }
}

impl<C: ConsumerContext + 'static> NativeClient for StreamConsumer<C> {
    fn native(&self) -> *mut rd_kafka_t {
        Consumer::client(self).native_ptr()
    }
}

impl<C: ClientContext + 'static> NativeClient for FutureProducer<C> {
    fn native(&self) -> *mut rd_kafka_t {
        Producer::client(self).native_ptr()
    }
}

impl<C: ProducerContext<NoCustomPartitioner> + 'static> NativeClient for BaseProducer<C> {
    fn native(&self) -> *mut rd_kafka_t {
        Producer::client(self).native_ptr()
    }
}

impl<C: ProducerContext<NoCustomPartitioner> + 'static> NativeClient for ThreadedProducer<C> {
    fn native(&self) -> *mut rd_kafka_t {
        Producer::client(self).native_ptr()
    }
}

impl<C: ClientContext + 'static> NativeClient for AdminClient<C> {
    fn native(&self) -> *mut rd_kafka_t {
        self.inner().native_ptr()
    }
}

/// A client from `config` with only the guard for a context.
pub fn create<T>(config: &ClientConfig) -> KafkaResult<T>
where
    T: FromClientConfigAndContext<Guarded> + NativeClient,
{
    create_with(config, Guarded)
}

/// [`create`] as a method, for the end of a chain of `ClientConfig::set`s:
/// `settings.kafka.producer().set("linger.ms", "1").create_guarded()`.
pub trait CreateGuarded {
    fn create_guarded<T>(&self) -> KafkaResult<T>
    where
        T: FromClientConfigAndContext<Guarded> + NativeClient;
}

impl CreateGuarded for ClientConfig {
    fn create_guarded<T>(&self) -> KafkaResult<T>
    where
        T: FromClientConfigAndContext<Guarded> + NativeClient,
    {
        create(self)
    }
}

/// A client from `config` with the context `context` makes around its guard; the
/// context's `stats` must pass the statistics to [`Rebootstrap::observe`].
pub fn create_with<T, C>(
    config: &ClientConfig,
    context: impl FnOnce(Rebootstrap) -> C,
) -> KafkaResult<T>
where
    C: ClientContext,
    T: FromClientConfigAndContext<C> + NativeClient,
{
    let guard = Rebootstrap::new(config.get("bootstrap.servers").unwrap_or_default());
    let mut config = config.clone();
    if config.get("statistics.interval.ms").is_none() {
        config.set("statistics.interval.ms", STATISTICS_INTERVAL_MS);
    }
    let client = T::from_config_and_context(&config, context(guard.clone()))?;
    let native = client.native();
    let _ = guard.inner.client.set(Native(native));
    // At 0 from the start, so the alert's increase() sees the first rescue.
    // SAFETY: the handle is the live client's, just created.
    let client_type = match unsafe { rd_kafka_type(native) } {
        rd_kafka_type_t::RD_KAFKA_PRODUCER => "producer",
        rd_kafka_type_t::RD_KAFKA_CONSUMER => "consumer",
    };
    metrics::counter!("kafka_rebootstraps_total", "client" => client_type).increment(0);
    Ok(client)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_with_only_logical_brokers_has_none_to_ask() {
        assert!(!has_broker(["logical", "internal"]));
        assert!(!has_broker([]));
        assert!(has_broker(["logical", "learned"]));
        assert!(has_broker(["configured", "internal"]));
    }
}
