//! Streaming test harness: a CDC namespace of its own for each test. It starts an
//! ingest-api on a fresh database, creates a topic `<ns>.chat.events`, and registers a
//! Debezium connector (the repo's `config/stack/chatpipe-outbox-connector.json`, with the
//! database, slot, publication and topic made the test's own) with the running Kafka
//! Connect, then waits until it streams. `cleanup` removes the connector, its
//! replication slot and the topic; namespaces of dead test processes are removed on the
//! next run.
//!
//! Kafka Connect, Kafka and the registry are those `scripts/stack up` starts, found
//! through `KAFKA_CONNECT_URL` (default http://127.0.0.1:8083) and `KAFKA_BROKERS`
//! (default 127.0.0.1:9092). If they are not there, the test fails and says so.

use chatpipe_core::kafka::CreateGuarded;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use chatpipe_core::kafka::StreamConsumer;
use chatpipe_schemas::registry::{DecodeError, EventDecoder, Registry};
use chatpipe_schemas::ChatEvent;
use rdkafka::admin::{AdminOptions, NewTopic, TopicReplication};
use rdkafka::consumer::Consumer;
use rdkafka::message::{Headers, Message};
use rdkafka::ClientConfig;
use serde_json::{json, Value};
use sqlx::{Connection, PgConnection};

use crate::{registry_url, server_url, spawn_app_with, TestApp};
use ingest_api::configuration::ReadMode;

const CONNECTOR_JSON: &str = include_str!("../../config/stack/chatpipe-outbox-connector.json");
const NS_PREFIX: &str = "cpt";

pub fn connect_url() -> String {
    crate::stack::endpoints().connect_url.clone()
}

pub fn brokers() -> String {
    crate::stack::endpoints().brokers.clone()
}

/// One record of the test's topic, decoded.
#[derive(Debug, Clone)]
pub struct Record {
    pub partition: i32,
    pub offset: i64,
    pub key: String,
    pub headers: HashMap<String, String>,
    pub bytes: Vec<u8>,
    pub event: ChatEvent,
}

/// (conversation, seq) of every message.new among `records`, in the order the topic gave
/// them.
pub fn messages(records: &[Record]) -> Vec<(i64, i64)> {
    records
        .iter()
        .filter_map(|r| match &r.event {
            ChatEvent::MessageNew(m) => Some((m.conversation_id.get(), m.seq.get())),
            _ => None,
        })
        .collect()
}

pub struct Pipeline {
    pub app: TestApp,
    pub ns: String,
    pub topic: String,
    /// `<ns>.chat.read-receipts`; its dead letters go to `<ns>.chat.read-receipts.dlq`.
    pub receipts_topic: String,
    /// `<ns>.chat.delivery-acks` (and its `.dlq`).
    pub acks_topic: String,
    /// `<ns>.chat.ephemeral` (and its `.dlq`): typing.
    pub ephemeral_topic: String,
    pub database_url: String,
    pub events_subject: String,
    pub connector: String,
    pub slot: String,
    pub decoder: EventDecoder,
    consumer: StreamConsumer,
}

/// Starts an app whose outbox streams, through Debezium, to a topic of this test's own.
/// Read receipts take the direct path.
pub async fn spawn_pipeline() -> Pipeline {
    spawn_pipeline_with(ReadMode::Direct).await
}

/// The same, with `reads.mode` chosen: `Stream` sends receipts to `<ns>.chat.read-receipts`
/// for a receipts processor ([`Pipeline::start_receipts`]).
pub async fn spawn_pipeline_with(reads: ReadMode) -> Pipeline {
    spawn_pipeline_adjusted(reads, |_| {}).await
}

/// The same, with the app's settings adjusted further by `adjust` (demo mode, say).
pub async fn spawn_pipeline_adjusted(
    reads: ReadMode,
    adjust: impl FnOnce(&mut ingest_api::configuration::Settings),
) -> Pipeline {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    crate::watchdog::arm();
    remove_stale_namespaces().await;
    let ns = format!(
        "{NS_PREFIX}{}x{}x{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed),
        &uuid::Uuid::new_v4().simple().to_string()[..6]
    );
    let topic = format!("{ns}.chat.events");
    let events_subject = format!("{topic}-value");
    let receipts_topic = format!("{ns}.chat.read-receipts");
    let acks_topic = format!("{ns}.chat.delivery-acks");
    let app = spawn_app_with(|s| {
        // History's cold tier: the keyspace the test's archiver writes (crate::cold).
        s.storage.keyspace = ns.clone();
        s.storage.bucket_size = crate::cold::BUCKET_SIZE;
        s.storage.cassandra_nodes = crate::cold::cassandra_nodes();
        s.registry.events_subject = events_subject.clone();
        s.reads.mode = reads;
        s.kafka.receipts_topic = receipts_topic.clone();
        s.kafka.acks_topic = acks_topic.clone();
        adjust(s);
    })
    .await;
    create_topic(&topic, 6).await;
    create_topic(&receipts_topic, 6).await;
    create_topic(&format!("{receipts_topic}.dlq"), 1).await;
    create_topic(&acks_topic, 6).await;
    create_topic(&format!("{acks_topic}.dlq"), 1).await;
    let ephemeral_topic = format!("{ns}.chat.ephemeral");
    create_topic(&ephemeral_topic, 6).await;
    create_topic(&format!("{ephemeral_topic}.dlq"), 1).await;
    create_topic(&format!("{topic}.dlq"), 1).await;
    create_topic_with(
        &format!("{ns}.chat.presence"),
        3,
        &[("cleanup.policy", "compact")],
    )
    .await;
    create_topic_with(
        &format!("{ns}.chat.fanout-members"),
        6,
        &[("cleanup.policy", "compact")],
    )
    .await;
    create_topic(
        &format!("{ns}.chat.deliveries"),
        crate::push::DELIVERY_PARTITIONS,
    )
    .await;
    create_topic(&format!("{ns}.chat.deliveries.dlq"), 1).await;
    create_topic(&format!("{ns}.chat.notifications"), 2).await;
    let db: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    let connector = format!("{ns}-outbox");
    let slot = format!("{ns}_slot");
    register_connector(&connector, &db, &slot, &ns, &topic).await;
    wait_until_streaming(&connector, &slot).await;

    let consumer: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .set("group.id", format!("{ns}-test"))
        // Rejoins at once after a broker stall (the fault tests), like our readers.
        .set("group.protocol", "consumer")
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .create_guarded()
        .expect("Kafka consumer");
    consumer.subscribe(&[&topic]).expect("subscribe");
    let decoder = Registry::new(&registry_url(), Duration::from_secs(5))
        .unwrap()
        .event_decoder();
    let database_url = crate::with_database(&server_url(), &db);
    Pipeline {
        app,
        ns,
        receipts_topic,
        acks_topic,
        ephemeral_topic,
        database_url,
        events_subject,
        topic,
        connector,
        slot,
        decoder,
        consumer,
    }
}

impl Pipeline {
    /// A second ingest-api process beside [`Pipeline::app`]: the same database (so the
    /// same outbox, streamed by the same connector) and the same settings.
    pub async fn app_beside(&self) -> crate::TestApp {
        let url = self.database_url.clone();
        let (subject, receipts, acks) = (
            self.events_subject.clone(),
            self.receipts_topic.clone(),
            self.acks_topic.clone(),
        );
        let ns = self.ns.clone();
        crate::spawn_app_with(|s| {
            s.storage.keyspace = ns;
            s.storage.bucket_size = crate::cold::BUCKET_SIZE;
            s.storage.cassandra_nodes = crate::cold::cassandra_nodes();
            s.database.url = secrecy::SecretString::from(url);
            s.registry.events_subject = subject;
            s.kafka.receipts_topic = receipts;
            s.kafka.acks_topic = acks;
        })
        .await
    }

    /// The record's event. A registry that does not answer (slow or restarting: 5 s
    /// timeouts were seen on a loaded 2-core machine) is asked again until `until`, as
    /// the processors do; any other failure fails the test.
    async fn decode(&self, bytes: &[u8], until: Instant) -> ChatEvent {
        loop {
            match self.decoder.decode(bytes).await {
                Ok(event) => return event,
                Err(DecodeError::Registry(e)) if e.retriable && Instant::now() < until => {
                    eprintln!("test consumer: the registry did not answer, asking again: {e}");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => panic!("the value decodes as a ChatEvent: {e:?}"),
            }
        }
    }

    /// Reads records until `done` says so, or fails at the deadline with what it saw.
    pub async fn consume_until(
        &self,
        deadline: Duration,
        mut done: impl FnMut(&[Record]) -> bool,
    ) -> Vec<Record> {
        let until = Instant::now() + deadline;
        let mut records = Vec::new();
        while !done(&records) {
            let left = until.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero(),
                "deadline of {deadline:?} passed with {} records on {}; connector status: {}",
                records.len(),
                self.topic,
                connector_status(&self.connector).await
            );
            let Ok(message) =
                tokio::time::timeout(left.min(Duration::from_millis(500)), self.consumer.recv())
                    .await
            else {
                continue;
            };
            let message = match message {
                Ok(message) => message,
                // The broker stalled or restarting (fault tests): the client reconnects.
                Err(err) => {
                    eprintln!("test consumer: {err}");
                    continue;
                }
            };
            let bytes = message
                .payload()
                .expect("chat.events records have values")
                .to_vec();
            let event = self.decode(&bytes, until).await;
            records.push(Record {
                partition: message.partition(),
                offset: message.offset(),
                key: String::from_utf8(message.key().expect("records have keys").to_vec()).unwrap(),
                headers: headers_of(&message).into_iter().collect(),
                bytes,
                event,
            });
        }
        records
    }

    /// Settings for a receipts processor of this namespace: its database, topics,
    /// subject and a consumer group of its own.
    pub fn receipts_settings(&self) -> pipeline::settings::Settings {
        let mut s = pipeline::settings::Settings::load(None).expect("pipeline defaults");
        s.kafka.brokers = brokers();
        s.registry.url = registry_url();
        s.registry.events_subject = self.events_subject.clone();
        s.database.url = crate::as_service(&self.database_url).into();
        s.receipts.topic = self.receipts_topic.clone();
        s.receipts.group = format!("{}-receipts", self.ns);
        s.receipts.acks_topic = self.acks_topic.clone();
        s.receipts.acks_group = format!("{}-acks", self.ns);
        s
    }

    /// Runs a receipts processor in this process until the handle is stopped.
    pub fn start_receipts(&self, settings: pipeline::settings::Settings) -> ReceiptsProcessor {
        ReceiptsProcessor::start(settings, pipeline::receipts::run_with)
    }

    /// Settings for an analytics processor of this namespace, whose four topics are
    /// made here (`<ns>.chat.analytics.*`, the messages compacted as the stack makes it).
    pub async fn analytics_settings(&self) -> pipeline::settings::Settings {
        let mut s = self.receipts_settings();
        let a = &mut s.analytics;
        a.events_topic = self.topic.clone();
        a.group = format!("{}-analytics", self.ns);
        a.messages_topic = format!("{}.chat.analytics.messages", self.ns);
        a.reads_topic = format!("{}.chat.analytics.reads", self.ns);
        a.deliveries_topic = format!("{}.chat.analytics.deliveries", self.ns);
        a.membership_topic = format!("{}.chat.analytics.membership", self.ns);
        a.linger_ms = 50;
        create_topic_with(
            &a.messages_topic,
            6,
            &[
                ("cleanup.policy", "compact"),
                ("min.cleanable.dirty.ratio", "0.1"),
            ],
        )
        .await;
        for topic in [&a.reads_topic, &a.deliveries_topic, &a.membership_topic] {
            create_topic(topic, 6).await;
        }
        s
    }

    /// Runs an analytics processor in this process until the handle is stopped.
    pub fn start_analytics(&self, settings: pipeline::settings::Settings) -> ReceiptsProcessor {
        ReceiptsProcessor::start(settings, pipeline::analytics::run_with)
    }

    /// Removes the connector, its replication slot and the topic.
    pub async fn cleanup(self) {
        let Pipeline {
            consumer,
            ns,
            connector,
            slot,
            ..
        } = self;
        // The test's consumer leaves its group while the topic still exists: a KIP-848
        // consumer closed after its topic was deleted can hang in its last rebalance
        // (seen: `rd_kafka_assign` waiting forever inside the consumer's drop).
        consumer.unsubscribe();
        close_consumer(consumer, "test").await;
        remove_namespace(&ns, Some(&connector), Some(&slot)).await;
    }
}

/// Whether the broker still lists the topic (deletion is asynchronous: polled briefly).
pub async fn topic_exists(topic: &str) -> bool {
    let admin: chatpipe_core::kafka::AdminClient = ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .create_guarded()
        .expect("Kafka admin client");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let metadata = admin
            .inner()
            .fetch_metadata(None, Duration::from_secs(5))
            .expect("Kafka metadata");
        let present = metadata.topics().iter().any(|t| t.name() == topic);
        if !present || Instant::now() > deadline {
            return present;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A processor (receipts, analytics) on a thread of this test; stops (flushing) when told
/// or dropped.
pub struct ReceiptsProcessor {
    stop: chatpipe_runtime::CancellationToken,
    /// Its readers' state, as its `/readyz` would report it.
    pub readiness: chatpipe_runtime::Readiness,
    thread: Option<std::thread::JoinHandle<anyhow::Result<()>>>,
}

impl ReceiptsProcessor {
    /// `run` (a processor's `run_with`) on a thread of its own.
    fn start(
        settings: pipeline::settings::Settings,
        run: fn(
            &pipeline::settings::Settings,
            chatpipe_runtime::CancellationToken,
            &chatpipe_runtime::Readiness,
        ) -> anyhow::Result<()>,
    ) -> Self {
        chatpipe_core::telemetry::init_logging();
        let stop = chatpipe_runtime::CancellationToken::new();
        let readiness = chatpipe_runtime::Readiness::default();
        let (flag, r) = (stop.clone(), readiness.clone());
        let thread = std::thread::spawn(move || run(&settings, flag, &r));
        Self {
            stop,
            readiness,
            thread: Some(thread),
        }
    }

    /// Stops it as SIGTERM would: flush the open window, commit, leave the group.
    pub fn stop(mut self) -> anyhow::Result<()> {
        self.stop.cancel();
        self.thread
            .take()
            .expect("running")
            .join()
            .expect("the processor thread panicked")
    }

    pub fn is_running(&self) -> bool {
        self.thread.as_ref().is_some_and(|t| !t.is_finished())
    }

    /// The partitions its readers hold now, as `/readyz` reports them.
    pub fn partitions(&self) -> Vec<i32> {
        held_partitions(&self.readiness, "receipts")
    }
}

/// The partitions held by the readers of a process whose names start with `readers`
/// (`receipts`, `fanout-events`), sorted.
pub fn held_partitions(readiness: &chatpipe_runtime::Readiness, readers: &str) -> Vec<i32> {
    let mut held: Vec<i32> = readiness
        .report()
        .into_iter()
        .filter(|r| r.reader.starts_with(readers))
        .flat_map(|r| r.partitions)
        .collect();
    held.sort_unstable();
    held
}

/// Waits until `holds` is true of the partitions every process's `readers` hold; fails
/// at the deadline with what each held.
pub async fn wait_for_partitions(
    processes: &[&chatpipe_runtime::Readiness],
    readers: &str,
    deadline: Duration,
    holds: impl Fn(&[i32]) -> bool,
) {
    let until = Instant::now() + deadline;
    loop {
        let held: Vec<Vec<i32>> = processes
            .iter()
            .map(|r| held_partitions(r, readers))
            .collect();
        if held.iter().all(|h| holds(h)) {
            return;
        }
        assert!(
            Instant::now() < until,
            "partitions held after {deadline:?}: {held:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

impl Drop for ReceiptsProcessor {
    fn drop(&mut self) {
        self.stop.cancel();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

pub async fn create_topic(topic: &str, partitions: i32) {
    create_topic_with(topic, partitions, &[]).await
}

/// Sets one setting of a topic, keeping the others it has. (Kafka's AlterConfigs, the
/// only call rdkafka has, replaces every setting of the topic: the ones it has now are
/// read and sent along.)
pub async fn set_topic_config(topic: &str, key: &str, value: &str) {
    let admin: chatpipe_core::kafka::AdminClient = ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .create_guarded()
        .expect("Kafka admin client");
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    let described = admin
        .describe_configs(&[rdkafka::admin::ResourceSpecifier::Topic(topic)], &options)
        .await
        .unwrap_or_else(|e| panic!("describing topic {topic}: {e}"));
    let current = described
        .into_iter()
        .next()
        .expect("one resource")
        .unwrap_or_else(|e| panic!("describing topic {topic}: {e}"));
    let mut change =
        rdkafka::admin::AlterConfig::new(rdkafka::admin::ResourceSpecifier::Topic(topic));
    for entry in &current.entries {
        if entry.source == rdkafka::admin::ConfigSource::DynamicTopic && entry.name != key {
            if let Some(v) = &entry.value {
                change = change.set(&entry.name, v);
            }
        }
    }
    let results = admin
        .alter_configs(&[change.set(key, value)], &options)
        .await
        .unwrap_or_else(|e| panic!("altering topic {topic} at {}: {e}", brokers()));
    for r in results {
        r.unwrap_or_else(|(resource, e)| panic!("setting {key}={value} on {resource:?}: {e}"));
    }
}

/// How many brokers `KAFKA_BROKERS` has: 1 on the single-node stack, 3 on the cluster.
pub fn broker_count() -> usize {
    static COUNT: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *COUNT.get_or_init(|| {
        let probe: chatpipe_core::kafka::BaseConsumer =
            chatpipe_core::kafka::client_config(&brokers())
                .create_guarded()
                .expect("Kafka client");
        probe
            .fetch_metadata(None, Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("Kafka is not reachable at {}: {e}", brokers()))
            .brokers()
            .len()
    })
}

/// Creates a topic as `scripts/stack` would on this Kafka: replication factor 1 on one
/// broker; on the cluster 3, with min.insync.replicas 2 unless `config` says otherwise.
pub async fn create_topic_with(topic: &str, partitions: i32, config: &[(&str, &str)]) {
    let replicas = broker_count().min(3) as i32;
    let mut new_topic = NewTopic::new(topic, partitions, TopicReplication::Fixed(replicas));
    for (k, v) in config {
        new_topic = new_topic.set(k, v);
    }
    if replicas == 3 && !config.iter().any(|(k, _)| *k == "min.insync.replicas") {
        new_topic = new_topic.set("min.insync.replicas", "2");
    }
    let admin: chatpipe_core::kafka::AdminClient = ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .create_guarded()
        .expect("Kafka admin client");
    let results = admin
        .create_topics(
            &[new_topic],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
        )
        .await
        .unwrap_or_else(|e| {
            panic!(
                "Kafka is not reachable at {}: {e}. Start it with `scripts/stack up`.",
                brokers()
            )
        });
    for r in results {
        r.unwrap_or_else(|(t, e)| panic!("creating topic {t}: {e}"));
    }
}

fn connector_config(db: &str, slot: &str, ns: &str, topic: &str) -> Value {
    let mut config: Value =
        serde_json::from_str(CONNECTOR_JSON).expect("the connector file is JSON");
    let url = url::Url::parse(&server_url()).expect("DATABASE_URL is a URL");
    let set = |config: &mut Value, k: &str, v: String| config[k] = Value::String(v);
    set(
        &mut config,
        "database.hostname",
        url.host_str().unwrap_or("127.0.0.1").to_owned(),
    );
    set(
        &mut config,
        "database.port",
        url.port().unwrap_or(5432).to_string(),
    );
    // The login (chatpipe_cdc over TLS) and the publication (each test database has the
    // migrations' own) stay the file's: the worker resolves the login from its
    // environment, as it does for the stack's connector.
    set(&mut config, "database.dbname", db.to_owned());
    set(&mut config, "slot.name", slot.to_owned());
    set(&mut config, "topic.prefix", ns.to_owned());
    set(
        &mut config,
        "transforms.outbox.route.topic.replacement",
        topic.to_owned(),
    );
    // Topic patterns name the prefix: the outbox's and the signal table's topics and the
    // heartbeat topics.
    for key in [
        "predicates.isOutbox.pattern",
        "predicates.isSignal.pattern",
        "topic.creation.heartbeats.include",
    ] {
        let pattern = config[key].as_str().expect("the connector file sets it");
        let pattern = pattern.replace("chatpipe\\.", &format!("{ns}\\."));
        set(&mut config, key, pattern);
    }
    config
}

/// A client of the Connect REST API whose calls fail instead of hanging.
fn connect_client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("HTTP client")
}

async fn register_connector(name: &str, db: &str, slot: &str, ns: &str, topic: &str) {
    let res = connect_client()
        .put(format!("{}/connectors/{name}/config", connect_url()))
        .json(&connector_config(db, slot, ns, topic))
        .send()
        .await
        .unwrap_or_else(|e| {
            panic!(
                "Kafka Connect is not reachable at {}: {e}. Start it with `scripts/stack up`.",
                connect_url()
            )
        });
    assert!(
        res.status().is_success(),
        "registering {name}: {} {}",
        res.status(),
        res.text().await.unwrap_or_default()
    );
}

pub async fn connector_status(name: &str) -> Value {
    match reqwest::get(format!("{}/connectors/{name}/status", connect_url())).await {
        Ok(res) => res.json().await.unwrap_or(Value::Null),
        Err(e) => json!({"unreachable": e.to_string()}),
    }
}

/// The connector and its task run, and the replication slot is held: from here on every
/// commit is captured.
pub async fn wait_until_streaming(connector: &str, slot: &str) {
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut admin = PgConnection::connect(&server_url())
        .await
        .expect("PostgreSQL");
    loop {
        let status = connector_status(connector).await;
        let running = status["connector"]["state"] == "RUNNING"
            && status["tasks"]
                .as_array()
                .is_some_and(|t| !t.is_empty() && t.iter().all(|t| t["state"] == "RUNNING"));
        let active: Option<bool> =
            sqlx::query_scalar("SELECT active FROM pg_replication_slots WHERE slot_name = $1")
                .bind(slot)
                .fetch_optional(&mut admin)
                .await
                .unwrap();
        if running && active == Some(true) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "connector {connector} not streaming after 90 s: {status}, slot active: {active:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Deletes a namespace's connector, slot and topics. Waits for the slot to be released.
async fn remove_namespace(ns: &str, connector: Option<&str>, slot: Option<&str>) {
    let http = connect_client();
    if let Some(c) = connector {
        let _ = http
            .delete(format!("{}/connectors/{c}", connect_url()))
            .send()
            .await;
    }
    if let Some(slot) = slot {
        let mut admin = PgConnection::connect(&server_url())
            .await
            .expect("PostgreSQL");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let dropped = sqlx::query(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1 AND NOT active",
            )
            .bind(slot)
            .execute(&mut admin)
            .await;
            let left: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1",
            )
            .bind(slot)
            .fetch_one(&mut admin)
            .await
            .unwrap();
            if left == 0 {
                break;
            }
            assert!(Instant::now() < deadline, "replication slot {slot} still held 30 s after its connector was deleted: {dropped:?}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let admin: chatpipe_core::kafka::AdminClient = ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .create_guarded()
        .expect("Kafka admin client");
    let metadata = admin
        .inner()
        .fetch_metadata(None, Duration::from_secs(10))
        .expect("Kafka metadata");
    let topics: Vec<String> = metadata
        .topics()
        .iter()
        .map(|t| t.name().to_owned())
        .filter(|t| t.starts_with(&format!("{ns}.")))
        .collect();
    if !topics.is_empty() {
        let names: Vec<&str> = topics.iter().map(String::as_str).collect();
        let _ = admin.delete_topics(&names, &AdminOptions::new()).await;
    }
}

/// Removes namespaces (connectors, slots, topics) of test processes that are gone.
async fn remove_stale_namespaces() {
    static ONCE: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    ONCE.get_or_init(|| async {
        let dead = |name: &str| -> Option<String> {
            let rest = name.strip_prefix(NS_PREFIX)?;
            let pid: u32 = rest.split('x').next()?.parse().ok()?;
            let ns_len = name.find(['.', '-', '_']).unwrap_or(name.len());
            (!std::path::Path::new(&format!("/proc/{pid}")).exists())
                .then(|| name[..ns_len].to_owned())
        };
        let connectors: Vec<String> =
            match reqwest::get(format!("{}/connectors", connect_url())).await {
                Ok(res) => res.json().await.unwrap_or_default(),
                Err(_) => Vec::new(),
            };
        let mut admin = PgConnection::connect(&server_url())
            .await
            .expect("PostgreSQL");
        let slots: Vec<String> = sqlx::query_scalar(
            "SELECT slot_name FROM pg_replication_slots WHERE slot_name LIKE $1",
        )
        .bind(format!("{NS_PREFIX}%"))
        .fetch_all(&mut admin)
        .await
        .unwrap_or_default();
        let mut namespaces: HashMap<String, (Option<String>, Option<String>)> = HashMap::new();
        for c in connectors {
            if let Some(ns) = dead(&c) {
                namespaces.entry(ns).or_default().0 = Some(c);
            }
        }
        for s in slots {
            if let Some(ns) = dead(&s) {
                namespaces.entry(ns).or_default().1 = Some(s);
            }
        }
        let admin: chatpipe_core::kafka::AdminClient = ClientConfig::new()
            .set("bootstrap.servers", brokers())
            .create_guarded()
            .expect("Kafka admin client");
        if let Ok(metadata) = admin.inner().fetch_metadata(None, Duration::from_secs(10)) {
            for t in metadata.topics() {
                if let Some(ns) = dead(t.name()) {
                    namespaces.entry(ns).or_default();
                }
            }
        }
        for (ns, (connector, slot)) in namespaces {
            remove_namespace(&ns, connector.as_deref(), slot.as_deref()).await;
        }
        crate::cold::drop_keyspaces_of_dead_tests(NS_PREFIX, |name| dead(name).is_some()).await;
    })
    .await;
}

/// Produces raw bytes to a topic (keyed), waiting for the broker's ack.
pub async fn produce_raw(topic: &str, key: &str, payload: &[u8]) {
    produce(topic, None, key, payload).await
}

/// Produces raw bytes to one partition of a topic, waiting for the broker's ack.
pub async fn produce_raw_to(topic: &str, partition: i32, key: &str, payload: &[u8]) {
    produce(topic, Some(partition), key, payload).await
}

async fn produce(topic: &str, partition: Option<i32>, key: &str, payload: &[u8]) {
    let producer: chatpipe_core::kafka::FutureProducer =
        chatpipe_core::kafka::producer_config(&brokers())
            .create_guarded()
            .expect("Kafka producer");
    let mut record = rdkafka::producer::FutureRecord::to(topic)
        .key(key)
        .payload(payload);
    if let Some(p) = partition {
        record = record.partition(p);
    }
    producer
        .send(record, Duration::from_secs(10))
        .await
        .unwrap_or_else(|(e, _)| panic!("producing to {topic}: {e}"));
}

/// A record's headers as (name, UTF-8 text) in order.
pub fn headers_of(m: &impl Message) -> Vec<(String, String)> {
    m.headers()
        .map(|hs| {
            hs.iter()
                .map(|h| {
                    (
                        h.key.to_owned(),
                        String::from_utf8_lossy(h.value.unwrap_or_default()).into_owned(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// (key, value, headers) of the first `n` records of a topic.
pub async fn dlq_records(topic: &str, n: usize) -> Vec<(String, Vec<u8>, Vec<(String, String)>)> {
    use chatpipe_core::kafka::StreamConsumer;
    use rdkafka::consumer::Consumer;
    use rdkafka::message::Message;
    let consumer: StreamConsumer =
        chatpipe_core::kafka::consumer_config(&brokers(), &format!("{topic}-check"))
            .create_guarded()
            .unwrap();
    consumer.subscribe(&[topic]).unwrap();
    let mut out = Vec::new();
    while out.len() < n {
        let m = tokio::time::timeout(Duration::from_secs(30), consumer.recv())
            .await
            .unwrap_or_else(|_| panic!("only {} records on {topic}", out.len()))
            .unwrap();
        let headers = headers_of(&m);
        out.push((
            String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned(),
            m.payload().unwrap_or_default().to_vec(),
            headers,
        ));
    }
    close_consumer(consumer, "DLQ check").await;
    out
}

/// Closes a test's Kafka consumer on a thread of its own and waits at most 30 s for it.
/// Closing leaves the group, a broker round trip, and librdkafka has been seen to hang
/// in it (`rd_kafka_assign` inside the drop): a close the test waited for without a
/// bound would hang the test, and one on the runtime's thread would stall the services
/// the test runs on it. Past the bound it is left to finish in the background.
pub async fn close_consumer<C: Send + 'static>(consumer: C, what: &str) {
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        drop(consumer);
        let _ = done_tx.send(());
    });
    if tokio::time::timeout(Duration::from_secs(30), done_rx)
        .await
        .is_err()
    {
        eprintln!("closing the {what} consumer took over 30 s; left to finish in the background");
    }
}

/// `group`'s committed offset on each partition of `topic` (0 where it has none).
pub fn committed(group: &str, topic: &str) -> Vec<i64> {
    let consumer: chatpipe_core::kafka::BaseConsumer =
        chatpipe_core::kafka::consumer_config(&brokers(), group)
            .create_guarded()
            .expect("Kafka consumer");
    let metadata = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .expect("metadata");
    let partitions = metadata.topics()[0].partitions().len() as i32;
    let mut wanted = rdkafka::TopicPartitionList::new();
    for p in 0..partitions {
        wanted.add_partition(topic, p);
    }
    let committed = consumer
        .committed_offsets(wanted, Duration::from_secs(10))
        .expect("committed offsets");
    (0..partitions)
        .map(
            |p| match committed.find_partition(topic, p).map(|e| e.offset()) {
                Some(rdkafka::Offset::Offset(o)) => o,
                _ => 0,
            },
        )
        .collect()
}

/// Partitions of `topic` where `group`'s committed offset is behind the end: (partition,
/// committed, end).
pub fn behind(group: &str, topic: &str) -> Vec<(i32, i64, i64)> {
    let ends: chatpipe_core::kafka::BaseConsumer =
        chatpipe_core::kafka::consumer_config(&brokers(), &format!("{group}-ends"))
            .create_guarded()
            .expect("Kafka consumer");
    let mut behind = Vec::new();
    for (p, at) in committed(group, topic).into_iter().enumerate() {
        let p = p as i32;
        let (_, high) = ends
            .fetch_watermarks(topic, p, Duration::from_secs(5))
            .expect("watermarks");
        if at < high {
            behind.push((p, at, high));
        }
    }
    behind
}

/// The records `topic` holds in all (the sum of its partitions' end offsets); 0 for a
/// topic that does not exist.
pub async fn end_offsets(topic: &str) -> i64 {
    let topic = topic.to_owned();
    tokio::task::spawn_blocking(move || {
        let consumer: chatpipe_core::kafka::BaseConsumer =
            chatpipe_core::kafka::consumer_config(&brokers(), &format!("{topic}-ends"))
                .create_guarded()
                .expect("Kafka consumer");
        let metadata = consumer
            .fetch_metadata(Some(&topic), Duration::from_secs(10))
            .expect("metadata");
        let partitions = metadata.topics()[0].partitions().len() as i32;
        (0..partitions)
            .map(|p| {
                consumer
                    .fetch_watermarks(&topic, p, Duration::from_secs(5))
                    .expect("watermarks")
                    .1
            })
            .sum()
    })
    .await
    .unwrap()
}

/// Whether `group` has committed every record of `topic`.
pub async fn is_consumed(group: &str, topic: &str) -> bool {
    let (group, topic) = (group.to_owned(), topic.to_owned());
    tokio::task::spawn_blocking(move || behind(&group, &topic).is_empty())
        .await
        .unwrap()
}

/// Waits until `group` has committed offsets up to the end of every partition of `topic`.
pub async fn wait_until_consumed(group: &str, topic: &str, deadline: Duration) {
    let until = Instant::now() + deadline;
    loop {
        let (g, t) = (group.to_owned(), topic.to_owned());
        let behind = tokio::task::spawn_blocking(move || behind(&g, &t))
            .await
            .unwrap();
        if behind.is_empty() {
            return;
        }
        assert!(
            Instant::now() < until,
            "group {group} still behind on {topic} after {deadline:?}: {behind:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The broker's SASL_SSL listener (`KAFKA_SASL_BROKERS` of `scripts/stack env`) as
/// `user` with `password`, the server's certificate checked against the stack's CA.
pub fn sasl(user: &str, password: &str) -> chatpipe_core::config::KafkaSettings {
    let var = |name: &str| {
        std::env::var(name).unwrap_or_else(|_| {
            panic!("{name} is not set: start the stack (`scripts/stack up`) and `eval \"$(scripts/stack env)\"`, as scripts/test does")
        })
    };
    let properties: chatpipe_core::kafka::Properties = [
        ("security.protocol", "SASL_SSL".to_owned()),
        ("sasl.mechanisms", "PLAIN".to_owned()),
        ("sasl.username", user.to_owned()),
        ("sasl.password", password.to_owned()),
        ("ssl.ca.location", var("STACK_TLS_CA")),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    chatpipe_core::config::KafkaSettings {
        brokers: var("KAFKA_SASL_BROKERS"),
        properties,
    }
}

/// A service's principal on the SASL_SSL listener (config/stack/kafka-acls):
/// `chatpipe_ingest`, `chatpipe_pipeline` or `chatpipe_gateway`, with its password from
/// `KAFKA_INGEST_PASSWORD`, … of `scripts/stack env`.
pub fn principal(user: &str) -> chatpipe_core::config::KafkaSettings {
    let var = format!(
        "KAFKA_{}_PASSWORD",
        user.trim_start_matches("chatpipe_").to_uppercase()
    );
    let password = std::env::var(&var).unwrap_or_else(|_| {
        panic!("{var} is not set: `eval \"$(scripts/stack env)\"`, as scripts/test does")
    });
    sasl(user, &password)
}

/// Runs a consumer example (`program args`) against the stack and returns the JSON
/// lines it printed. It stops by itself (`--max`, `--idle-timeout`); past 120 s it is
/// stuck, and the test fails with its stderr.
pub async fn run_example(what: &str, program: &str, args: &[&str]) -> Vec<serde_json::Value> {
    let run = tokio::process::Command::new(program)
        .args(args)
        .env("KAFKA_BROKERS", brokers())
        .env("SCHEMA_REGISTRY_URL", registry_url())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(120), run)
        .await
        .unwrap_or_else(|_| panic!("{what} finished within 120 s"))
        .unwrap_or_else(|e| panic!("{what} runs ({program}): {e}"));
    assert!(
        output.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect()
}
