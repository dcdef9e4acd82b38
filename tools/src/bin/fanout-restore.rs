//! `fanout-restore`: how long a restarted fanout takes to restore its membership store,
//! and its resident memory, against the length of chat.events' history.
//!
//! For each history length (default 100k, 1M, 10M records) it makes a namespace of its
//! own (topics `<ns>.chat.events` and `<ns>.chat.fanout-members`), writes the history
//! (old messages over the conversations), starts the fanout group after it, writes the
//! same live state every time (10,000 conversations of two members each), runs `pipeline
//! fanout` (the release binary, a process of its own) until it has applied that state,
//! stops it, starts it again and times the restore: from the process start until its
//! store holds every live conversation (`fanout_conversations`), with one fresh message
//! per partition to make each partition restore. The ratio of the longest history's
//! restore to the shortest's is what the issue bounds (within 2x for 100x the history).
//!
//! ```sh
//! cargo build --release -p pipeline -p chatpipe-tools --bin fanout-restore
//! eval "$(scripts/stack env)" && target/release/fanout-restore
//! ```

use chatpipe_core::kafka::CreateGuarded;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use chatpipe_schemas::registry::Registry;
use chatpipe_schemas::{ChatEvent, MessageNew};
use chatpipe_tests::bench::{
    live_groups, old_messages, produce_events, start_group_at_end, SYNTHETIC_FIRST_ID,
};
use clap::Parser;
use rdkafka::admin::{AdminOptions, NewTopic, TopicReplication};
use rdkafka::ClientConfig;

#[derive(Parser, Debug)]
#[command(about = "fanout restore time and RSS against chat.events history length")]
struct Args {
    #[command(flatten)]
    stack: chatpipe_tests::bench::StackArgs,
    /// History lengths, in records.
    #[arg(long, value_delimiter = ',', default_value = "100000,1000000,10000000")]
    history: Vec<i64>,
    /// Live conversations (two members each), the same for every history length.
    #[arg(long, default_value_t = 10_000)]
    conversations: i64,
    /// The pipeline binary.
    #[arg(long, default_value = "target/release/pipeline")]
    pipeline: String,
    #[arg(long, env = "DATABASE_URL")]
    database_url: String,
    #[arg(long, default_value = "127.0.0.1:9199")]
    metrics_addr: String,
}

const PARTITIONS: i32 = 6;

async fn create_topics(brokers: &str, ns: &str) -> anyhow::Result<()> {
    let admin: chatpipe_core::kafka::AdminClient = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create_guarded()?;
    let events = format!("{ns}.chat.events");
    let changelog = format!("{ns}.chat.fanout-members");
    let presence = format!("{ns}.chat.presence");
    let deliveries = format!("{ns}.chat.deliveries");
    let topics = [
        NewTopic::new(&events, PARTITIONS, TopicReplication::Fixed(1)),
        NewTopic::new(&changelog, PARTITIONS, TopicReplication::Fixed(1))
            .set("cleanup.policy", "compact"),
        NewTopic::new(&presence, 1, TopicReplication::Fixed(1)).set("cleanup.policy", "compact"),
        NewTopic::new(&deliveries, 1, TopicReplication::Fixed(1)),
    ];
    for r in admin.create_topics(&topics, &AdminOptions::new()).await? {
        r.map_err(|(t, e)| anyhow::anyhow!("creating {t}: {e}"))?;
    }
    Ok(())
}

/// Removes the run's topics (a 10M-record history is ~150 MB of broker disk).
async fn delete_topics(brokers: &str, ns: &str) -> anyhow::Result<()> {
    let admin: chatpipe_core::kafka::AdminClient = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create_guarded()?;
    let names: Vec<String> = [
        "chat.events",
        "chat.fanout-members",
        "chat.presence",
        "chat.deliveries",
    ]
    .iter()
    .map(|t| format!("{ns}.{t}"))
    .collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    admin.delete_topics(&refs, &AdminOptions::new()).await?;
    Ok(())
}

fn start_fanout(args: &Args, ns: &str) -> anyhow::Result<Child> {
    Command::new(&args.pipeline)
        .arg("fanout")
        .env("KAFKA_BROKERS", &args.stack.brokers)
        .env("SCHEMA_REGISTRY_URL", &args.stack.registry)
        .env("DATABASE_URL", &args.database_url)
        .env("CHATPIPE_HTTP__METRICS_ADDR", &args.metrics_addr)
        .env("CHATPIPE_FANOUT__EVENTS_TOPIC", format!("{ns}.chat.events"))
        .env(
            "CHATPIPE_FANOUT__CHANGELOG_TOPIC",
            format!("{ns}.chat.fanout-members"),
        )
        .env(
            "CHATPIPE_FANOUT__PRESENCE_TOPIC",
            format!("{ns}.chat.presence"),
        )
        .env(
            "CHATPIPE_FANOUT__DELIVERIES_TOPIC",
            format!("{ns}.chat.deliveries"),
        )
        .env("CHATPIPE_FANOUT__GROUP", format!("{ns}-fanout"))
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("starting {}", args.pipeline))
}

/// A gauge or counter from the process's /metrics (summed over labels).
async fn metric(addr: &str, name: &str) -> Option<f64> {
    let text = reqwest::get(format!("http://{addr}/metrics"))
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    chatpipe_tests::metric_sum(&text, name, &[])
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

fn stop(mut child: Child) {
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let _ = child.wait();
}

async fn wait_metric(
    addr: &str,
    name: &str,
    at_least: f64,
    deadline: Duration,
) -> anyhow::Result<()> {
    let until = Instant::now() + deadline;
    loop {
        if metric(addr, name).await.is_some_and(|v| v >= at_least) {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < until,
            "{name} did not reach {at_least} within {deadline:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let brokers = args.stack.brokers.clone();
    let registry = Registry::new(&args.stack.registry, Duration::from_secs(5))?;
    let long_ago = chrono::Utc::now() - chrono::Duration::days(3);
    println!("| history (records) | restore (start to every conversation in memory) | RSS after restore |");
    println!("|---|---|---|");
    let mut results = Vec::new();
    for &history in &args.history {
        let ns = format!("bench{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
        create_topics(&brokers, &ns).await?;
        let codec = registry
            .event_codec_for(&format!("{ns}.chat.events-value"))
            .await?;
        let events = format!("{ns}.chat.events");
        let (b, t, c, live) = (
            brokers.clone(),
            events.clone(),
            codec.clone(),
            args.conversations,
        );
        tokio::task::spawn_blocking(move || {
            produce_events(&b, &t, old_messages(&c, history, live, long_ago))
        })
        .await?;
        // The group starts after the history.
        start_group_at_end(&brokers, &format!("{ns}-fanout"), &events, PARTITIONS);
        // The live state, the same for every history length.
        let (b, t, c) = (brokers.clone(), events.clone(), codec.clone());
        let membership = tokio::task::spawn_blocking(move || {
            produce_events(&b, &t, live_groups(&c, live, long_ago))
        })
        .await?;
        let first = start_fanout(&args, &ns)?;
        wait_metric(
            &args.metrics_addr,
            "fanout_records_total",
            membership as f64,
            Duration::from_secs(300),
        )
        .await?;
        stop(first);

        // The restart: one fresh message per partition makes each partition restore.
        let second = start_fanout(&args, &ns)?;
        let started = Instant::now();
        let (b, t, c) = (brokers.clone(), events.clone(), codec.clone());
        tokio::task::spawn_blocking(move || {
            produce_events(
                &b,
                &t,
                (0..live).step_by((live / 60).max(1) as usize).map(|i| {
                    let conversation = SYNTHETIC_FIRST_ID + i;
                    let e = ChatEvent::MessageNew(MessageNew {
                        conversation_id: chatpipe_schemas::ConversationId::of(conversation),
                        seq: chatpipe_schemas::Seq::of(1_000_000),
                        sender_id: chatpipe_schemas::UserId::of(1),
                        client_msg_id: uuid::Uuid::new_v4(),
                        body: "now".into(),
                        mentions: Vec::new(),
                        thread_root_seq: None,
                        created_at: chrono::Utc::now(),
                    });
                    (conversation, c.encode(&e))
                }),
            )
        })
        .await?;
        wait_metric(
            &args.metrics_addr,
            "fanout_conversations",
            live as f64,
            Duration::from_secs(300),
        )
        .await?;
        let restore = started.elapsed();
        let rss = rss_kib(second.id());
        let restored = metric(&args.metrics_addr, "fanout_restored_records_total")
            .await
            .unwrap_or(0.0);
        stop(second);
        delete_topics(&brokers, &ns).await?;
        println!(
            "| {history} | {:.2} s ({restored} changelog records) | {:.1} MiB |",
            restore.as_secs_f64(),
            rss as f64 / 1024.0
        );
        results.push((history, restore));
    }
    if let (Some(first), Some(last)) = (results.first(), results.last()) {
        println!(
            "\nrestore time ratio, {} vs {} records of history: {:.2}x (history {:.0}x)",
            last.0,
            first.0,
            last.1.as_secs_f64() / first.1.as_secs_f64(),
            last.0 as f64 / first.0 as f64
        );
    }
    Ok(())
}
