//! `pipeline tail TOPIC`: what a data engineer types first. Decodes each record with
//! the schema registry and prints one JSON line: partition, offset, key, headers and
//! the value. chat.events values print as the typed event; other topics as the generic
//! JSON form of their Avro record.

use std::time::Duration;

use anyhow::Context;
use chatpipe_core::kafka::{CreateGuarded, StreamConsumer};
use chatpipe_schemas::contract::CHAT_EVENTS;
use rdkafka::consumer::Consumer;
use rdkafka::message::{Headers, Message};
use schema_registry_converter::async_impl::avro::AvroDecoder;
use schema_registry_converter::async_impl::schema_registry::SrSettings;
use serde_json::{json, Value};

use crate::settings::Settings;

#[derive(clap::Args, Debug, Clone)]
pub struct TailArgs {
    /// The topic, e.g. chat.events.
    pub topic: String,
    /// Start at the oldest record instead of the next new one.
    #[arg(long)]
    pub from_beginning: bool,
    /// Only records with this key (a conversation id for chat.events).
    #[arg(long)]
    pub key: Option<String>,
    /// Stop after printing this many records.
    #[arg(long)]
    pub max: Option<u64>,
    /// Stop when no record arrives for this many seconds.
    #[arg(long)]
    pub idle_timeout: Option<u64>,
}

/// Prints the topic's records as JSON lines to `out` until `max` or `idle_timeout`.
/// Topics named `*chat.events` decode as the typed event.
pub async fn run(
    settings: &Settings,
    args: TailArgs,
    out: &mut impl std::io::Write,
) -> anyhow::Result<()> {
    let timeout = Duration::from_millis(settings.registry.timeout_ms);
    let registry = settings.registry.connect()?;
    let events = registry.event_decoder();
    let generic = AvroDecoder::new(
        SrSettings::new_builder(settings.registry.url.clone())
            .no_proxy()
            .set_timeout(timeout)
            .build()?,
    );
    // It reaches the cluster as the services do (kafka.properties: TLS, SASL).
    let consumer: StreamConsumer = settings
        .kafka
        .client()
        // A throwaway group: tail never commits and never steals partitions from anyone.
        .set(
            "group.id",
            format!("chatpipe-tail-{}", uuid::Uuid::new_v4()),
        )
        .set("enable.auto.commit", "false")
        .set(
            "auto.offset.reset",
            if args.from_beginning {
                "earliest"
            } else {
                "latest"
            },
        )
        .set("isolation.level", "read_committed")
        .create_guarded()
        .context("creating the Kafka consumer")?;
    consumer
        .subscribe(&[&args.topic])
        .with_context(|| format!("subscribing to {}", args.topic))?;

    let mut printed = 0u64;
    loop {
        let next = consumer.recv();
        let message = match args.idle_timeout {
            Some(secs) => match tokio::time::timeout(Duration::from_secs(secs), next).await {
                Ok(m) => m,
                Err(_) => break,
            },
            None => next.await,
        }
        .context("reading from Kafka")?;
        let key = message
            .key()
            .map(|k| String::from_utf8_lossy(k).into_owned());
        if args.key.is_some() && key != args.key {
            continue;
        }
        let value = match message.payload() {
            None => Value::Null,
            Some(bytes) if args.topic.ends_with(CHAT_EVENTS.topic) => {
                match events.decode(bytes).await {
                    Ok(event) => serde_json::to_value(event)?,
                    Err(err) => json!({"undecodable": err.to_string()}),
                }
            }
            Some(bytes) => match generic.decode(Some(bytes)).await {
                Ok(decoded) => Value::try_from(decoded.value)
                    .unwrap_or_else(|e| json!({"undecodable": e.to_string()})),
                Err(err) => json!({"undecodable": err.to_string()}),
            },
        };
        let headers: serde_json::Map<String, Value> = message
            .headers()
            .map(|hs| {
                hs.iter()
                    .map(|h| {
                        (
                            h.key.to_owned(),
                            Value::String(
                                String::from_utf8_lossy(h.value.unwrap_or_default()).into(),
                            ),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        let line = json!({
            "partition": message.partition(),
            "offset": message.offset(),
            "key": key,
            "headers": headers,
            "value": value,
        });
        writeln!(out, "{line}")?;
        printed += 1;
        if args.max.is_some_and(|max| printed >= max) {
            break;
        }
    }
    Ok(())
}
