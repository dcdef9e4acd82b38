//! History across the two tiers, measured: `--messages` (10 million) over
//! `--conversations` (10,000), of which `--archived` (90%) are older than the hot window.
//! A measurement, not a test.
//!
//!   eval "$(scripts/stack env)"; cargo build --release -p pipeline -p chatpipe-tools
//!   target/release/history-tiers [--messages 10000000] [--conversations 10000]
//!
//! 1. A fresh database: the groups made over the API, the messages written by SQL (about
//!    300 bytes each, `createdAt` spread so that the oldest `--archived` share of each
//!    conversation is older than `--hot-retention-s`). Their sizes, all hot.
//! 2. Every message as `message.new` on a topic of its own, and `pipeline archive` (the
//!    release binary beside this one) reading it with a fresh group: archiver throughput
//!    is the messages over the time until the group has committed every record (Kafka's
//!    offsets), against `--send-rate` (the sends/s the stack sustains, from send-load).
//! 3. The archiver's retention step moves the old rows out (until `message_archive` says
//!    every conversation's old share left); PostgreSQL's sizes again, then after VACUUM
//!    FULL (what the table needs for the hot window alone).
//! 4. History pages of 50 from an ingest-api in this process, `--requests` of each kind
//!    interleaved: hot (the newest page), cold (a page wholly archived), straddling (half
//!    and half): p50 and p99, and cold p99 over hot p99 (goal ≤ 3).

use std::time::{Duration, Instant};

use anyhow::Context;
use chatpipe_core::auth::TokenKeys;
use chatpipe_core::UserId;
use chatpipe_schemas::{ChatEvent, ConversationId, MessageNew, Seq};
use chatpipe_tests::bench::{machine, produce_events, write_report, GroupProgress, StackArgs};
use clap::Parser;
use futures::StreamExt;
use hdrhistogram::Histogram;
use ingest_api::configuration::{Bucket, Settings};
use ingest_api::startup::Application;
use rand::{Rng, SeedableRng};
use secrecy::SecretString;
use serde_json::json;
use sqlx::{Connection, Executor, PgConnection};

const JWT_SECRET: &str = "history-tiers-secret-history-tiers!!";
const PAGE: i64 = 50;
const BODY_BYTES: usize = 300;

#[derive(Parser)]
struct Args {
    #[arg(long, default_value_t = 10_000_000)]
    messages: i64,
    #[arg(long, default_value_t = 10_000)]
    conversations: i64,
    /// The share of each conversation older than the hot window.
    #[arg(long, default_value_t = 0.9)]
    archived: f64,
    /// The hot window (the shipped default, 30 days): the messages' times are spread over
    /// it so that the newest share is half a step inside it.
    #[arg(long, default_value_t = 2_592_000)]
    hot_retention_s: u64,
    /// History pages of each kind.
    #[arg(long, default_value_t = 2000)]
    requests: usize,
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// The sends/s the stack sustains (send-load's figure on this machine), for the
    /// archiver's ratio.
    #[arg(long, default_value_t = 4400.0)]
    send_rate: f64,
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "postgres://postgres:postgres@127.0.0.1:5432/postgres"
    )]
    database_url: String,
    #[arg(long, env = "CASSANDRA_NODES", default_value = "127.0.0.1:9042")]
    cassandra_nodes: String,
    #[command(flatten)]
    stack: StackArgs,
    /// Keep the database, topic and keyspace afterwards.
    #[arg(long)]
    keep: bool,
    #[arg(long, default_value = "target/bench/history-tiers.json")]
    out: String,
}

/// What the seed and the events agree on, so that the retention step finds Cassandra's
/// copies equal: each message's client id, body and time.
#[derive(Clone, Copy)]
struct Seed {
    per: i64,
    /// µs since the epoch of the newest message; older ones `step_us` apart.
    newest_us: i64,
    step_us: i64,
}

impl Seed {
    fn new(args: &Args) -> Self {
        let per = args.messages / args.conversations;
        let hot = ((per as f64) * (1.0 - args.archived)).round().max(1.0) as i64;
        // The newest `hot` messages are younger than the hot window by half a step at
        // least (hours, at the default window), the others older by as much.
        let step_us = (args.hot_retention_s as f64 * 1e6 / (hot as f64 - 0.5)) as i64;
        Self {
            per,
            newest_us: chrono::Utc::now().timestamp_micros(),
            step_us,
        }
    }

    fn created_us(&self, seq: i64) -> i64 {
        self.newest_us - (self.per - seq) * self.step_us
    }

    fn body(conversation: i64, seq: i64) -> String {
        let head = format!("message {seq} of {conversation} ");
        format!("{head:x<BODY_BYTES$}")
    }

    fn client_msg_id(conversation: i64, seq: i64) -> uuid::Uuid {
        uuid::Uuid::from_u64_pair(conversation as u64, seq as u64)
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    chatpipe_core::telemetry::init_logging();
    let run = format!("tiers{}", chatpipe_core::auth::unix_now());
    let seed = Seed::new(&args);
    anyhow::ensure!(
        seed.per >= 4 * PAGE,
        "at least {} messages per conversation",
        4 * PAGE
    );
    let keys = TokenKeys::new(&SecretString::from(JWT_SECRET), Duration::ZERO)?;

    // 1. The database, all hot.
    let url = chatpipe_tests::with_database(&args.database_url, &run);
    let mut admin = PgConnection::connect(&args.database_url).await?;
    admin
        .execute(format!("CREATE DATABASE \"{run}\"").as_str())
        .await?;
    chatpipe_tests::migrate_as_owner(&url).await;
    let (app_base, stop_api) = start_api(&args, &url, &run).await?;
    let http = reqwest::Client::new();
    let t = Instant::now();
    let conversations = create_groups(&args, &http, &app_base, &keys).await?;
    println!(
        "{} groups made over the API in {:.1} s",
        conversations.len(),
        t.elapsed().as_secs_f64()
    );
    let mut db = PgConnection::connect(&url).await?;
    let t = Instant::now();
    seed_messages(&mut db, &seed, &conversations).await?;
    println!(
        "{} messages written by SQL in {:.1} s",
        seed.per * conversations.len() as i64,
        t.elapsed().as_secs_f64()
    );
    db.execute("VACUUM ANALYZE").await?;
    let all_hot = sizes(&mut db).await?;
    println!("all hot: {all_hot}");

    // 2. The archiver.
    let topic = format!("{run}.chat.events");
    chatpipe_tests::stream::create_topic(&topic, 6).await;
    let registry =
        chatpipe_schemas::registry::Registry::new(&args.stack.registry, Duration::from_secs(5))?;
    let codec = registry.event_codec_for(&format!("{topic}-value")).await?;
    let t = Instant::now();
    let produced = {
        let (brokers, topic, conversations) = (
            args.stack.brokers.clone(),
            topic.clone(),
            conversations.clone(),
        );
        let (per, seed_ref) = (seed.per, seed);
        tokio::task::spawn_blocking(move || {
            let events = (1..=per)
                .flat_map(|seq| conversations.iter().map(move |&c| (c, seq)))
                .map(|(c, seq)| {
                    let event = ChatEvent::MessageNew(MessageNew {
                        conversation_id: ConversationId::of(c),
                        seq: Seq::of(seq),
                        sender_id: UserId::of(1),
                        client_msg_id: Seed::client_msg_id(c, seq),
                        body: Seed::body(c, seq),
                        mentions: Vec::new(),
                        thread_root_seq: None,
                        created_at: chrono::DateTime::from_timestamp_micros(
                            seed_ref.created_us(seq),
                        )
                        .expect("a time"),
                    });
                    (c, codec.encode(&event))
                });
            produce_events(&brokers, &topic, events)
        })
        .await?
    };
    println!(
        "{produced} message.new on {topic} in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let group = format!("{run}-archive");
    let mut archiver = archiver(&args, &url, &run, &topic, &group)?;
    let progress = GroupProgress::new(&args.stack.brokers, &group, &topic)?;
    let t = Instant::now();
    loop {
        let (_, left) = progress.read()?;
        if left == 0 {
            break;
        }
        anyhow::ensure!(archiver.try_wait()?.is_none(), "pipeline archive exited");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let archive_s = t.elapsed().as_secs_f64();
    let archive_rate = produced as f64 / archive_s;
    println!(
        "archived {produced} in {archive_s:.1} s: {archive_rate:.0} messages/s, {:.2}x the send rate {}",
        archive_rate / args.send_rate,
        args.send_rate
    );

    // 3. The old share moved out.
    let old = seed.per - ((seed.per as f64) * (1.0 - args.archived)).round() as i64;
    let t = Instant::now();
    loop {
        let behind: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM conversation c LEFT JOIN message_archive a ON a.conversation_id = c.id
              WHERE coalesce(a.cold_through, 0) < $1",
        )
        .bind(old)
        .fetch_one(&mut db)
        .await?;
        if behind == 0 {
            break;
        }
        anyhow::ensure!(archiver.try_wait()?.is_none(), "pipeline archive exited");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let moved_s = t.elapsed().as_secs_f64();
    println!("the oldest {old} of each conversation moved out in {moved_s:.1} s after archiving");
    db.execute("VACUUM ANALYZE").await?;
    let moved = sizes(&mut db).await?;
    db.execute("VACUUM FULL message").await?;
    let compacted = sizes(&mut db).await?;
    println!("after the move: {moved}\nafter VACUUM FULL: {compacted}");

    // 4. Pages.
    let latencies = pages(&args, &http, &app_base, &keys, &conversations, old).await?;
    let q = |h: &Histogram<u64>, p: f64| h.value_at_quantile(p) as f64 / 1000.0;
    let (hot, cold, straddle) = (&latencies[0], &latencies[1], &latencies[2]);
    let ratio = q(cold, 0.99) / q(hot, 0.99);
    println!("history page of {PAGE}, ms   p50     p99");
    for (name, h) in [("hot", hot), ("cold", cold), ("straddling", straddle)] {
        println!("  {name:<12} {:>8.2} {:>8.2}", q(h, 0.5), q(h, 0.99));
    }
    println!("cold p99 / hot p99: {ratio:.2} (goal <= 3)");

    archiver.start_kill()?;
    let _ = stop_api.send(());
    let report = json!({
        "messages": produced, "conversations": conversations.len(), "per_conversation": seed.per,
        "archived_share": args.archived, "hot_retention_s": args.hot_retention_s,
        "sizes_all_hot": all_hot.json(), "sizes_after_move": moved.json(), "sizes_after_vacuum_full": compacted.json(),
        "archiver_seconds": archive_s, "archiver_messages_per_s": archive_rate, "send_rate": args.send_rate,
        "archiver_over_send_rate": archive_rate / args.send_rate, "move_seconds_after_archive": moved_s,
        "pages_ms": {
            "hot": {"p50": q(hot, 0.5), "p99": q(hot, 0.99), "n": hot.len()},
            "cold": {"p50": q(cold, 0.5), "p99": q(cold, 0.99), "n": cold.len()},
            "straddling": {"p50": q(straddle, 0.5), "p99": q(straddle, 0.99), "n": straddle.len()},
        },
        "cold_p99_over_hot_p99": ratio,
        "machine": machine(),
    });
    write_report(&args.out, &report)?;
    if !args.keep {
        drop(db);
        chatpipe_tests::cold::drop_keyspace(&chatpipe_tests::cold::session().await, &run).await;
        admin
            .execute(format!("DROP DATABASE \"{run}\" WITH (FORCE)").as_str())
            .await?;
    }
    Ok(())
}

/// ingest-api in this process on the bench database, history reading `keyspace`.
async fn start_api(
    args: &Args,
    url: &str,
    keyspace: &str,
) -> anyhow::Result<(String, tokio::sync::oneshot::Sender<()>)> {
    let mut settings = Settings::defaults_with_secret(JWT_SECRET);
    settings.http.addr = "127.0.0.1:0".parse()?;
    settings.admin.addr = "127.0.0.1:0".parse()?;
    settings.http.max_connections_per_ip = settings.http.max_connections;
    settings.database.url = SecretString::from(chatpipe_tests::as_service(url));
    settings.database.migrate_on_start = false;
    settings.registry.url = args.stack.registry.clone();
    settings.kafka.brokers = args.stack.brokers.clone();
    settings.storage.cassandra_nodes = args.cassandra_nodes.clone();
    settings.storage.keyspace = keyspace.to_owned();
    settings.storage.hot_retention_s = args.hot_retention_s;
    let plenty = Bucket {
        rate: 1_000_000,
        per_secs: 1,
        burst: 1_000_000,
    };
    settings.rate_limits.creates = plenty;
    settings.rate_limits.members_added = plenty;
    settings.rate_limits.reads = plenty;
    let app = Application::build(settings).await?;
    let base = format!("http://{}", app.local_addr());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(app.run_until_stopped(async {
        let _ = stopped.await;
    }));
    Ok((base, stop))
}

/// The groups, each made by user 1 with user 2.
async fn create_groups(
    args: &Args,
    http: &reqwest::Client,
    base: &str,
    keys: &TokenKeys,
) -> anyhow::Result<Vec<i64>> {
    let token = keys.issue(UserId::of(1), Duration::from_secs(7200));
    let made: Vec<anyhow::Result<i64>> = futures::stream::iter(0..args.conversations)
        .map(|_| {
            let req = http
                .post(format!("{base}/v1/conversations"))
                .bearer_auth(&token)
                .json(&json!({"type": "GROUP", "title": "tiers", "memberIds": [2]}));
            async move {
                let body: serde_json::Value = req.send().await?.error_for_status()?.json().await?;
                body["conversationId"].as_i64().context("conversationId")
            }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    made.into_iter().collect()
}

/// Every message by SQL, one statement per 100 conversations, as the seed says.
async fn seed_messages(
    db: &mut PgConnection,
    seed: &Seed,
    conversations: &[i64],
) -> anyhow::Result<()> {
    for chunk in conversations.chunks(100) {
        sqlx::query(
            "INSERT INTO message (conversation_id, seq, sender_id, client_msg_id, body, created_at)
             SELECT c, s, 1,
                    (lpad(to_hex(c), 16, '0') || lpad(to_hex(s), 16, '0'))::uuid,
                    rpad('message ' || s || ' of ' || c || ' ', $4, 'x'),
                    'epoch'::timestamptz + ($2 - ($3 - s) * $5) * interval '1 microsecond'
               FROM unnest($1::BIGINT[]) AS c, generate_series(1, $3) AS s",
        )
        .bind(chunk)
        .bind(seed.newest_us)
        .bind(seed.per)
        .bind(BODY_BYTES as i32)
        .bind(seed.step_us)
        .execute(&mut *db)
        .await?;
    }
    sqlx::query("UPDATE conversation SET last_seq = $1, last_message_at = now()")
        .bind(seed.per)
        .execute(&mut *db)
        .await?;
    Ok(())
}

struct Sizes {
    message_bytes: i64,
    database_bytes: i64,
    message_rows: i64,
}

impl Sizes {
    fn json(&self) -> serde_json::Value {
        json!({"message_bytes": self.message_bytes, "database_bytes": self.database_bytes, "message_rows": self.message_rows})
    }
}

impl std::fmt::Display for Sizes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mb = |b: i64| b as f64 / (1024.0 * 1024.0);
        write!(
            f,
            "message {:.0} MiB ({} rows), database {:.0} MiB",
            mb(self.message_bytes),
            self.message_rows,
            mb(self.database_bytes)
        )
    }
}

async fn sizes(db: &mut PgConnection) -> anyhow::Result<Sizes> {
    let (message_bytes, database_bytes, message_rows): (i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT sum(pg_total_relation_size(relid))::BIGINT FROM pg_partition_tree('message')),
                pg_database_size(current_database()),
                (SELECT count(*) FROM message)",
    )
    .fetch_one(&mut *db)
    .await?;
    Ok(Sizes {
        message_bytes,
        database_bytes,
        message_rows,
    })
}

/// `pipeline archive` (the binary beside this one) on the bench's topic and keyspace.
fn archiver(
    args: &Args,
    url: &str,
    keyspace: &str,
    topic: &str,
    group: &str,
) -> anyhow::Result<tokio::process::Child> {
    let bin = std::env::var("CHATPIPE_PIPELINE_BIN")
        .map(std::path::PathBuf::from)
        .or_else(|_| std::env::current_exe().map(|e| e.with_file_name("pipeline")))?;
    tokio::process::Command::new(&bin)
        .arg("archive")
        .env("KAFKA_BROKERS", &args.stack.brokers)
        .env("SCHEMA_REGISTRY_URL", &args.stack.registry)
        .env("DATABASE_URL", chatpipe_tests::as_service(url))
        .env("CASSANDRA_NODES", &args.cassandra_nodes)
        .env("CHATPIPE_ARCHIVE__EVENTS_TOPIC", topic)
        .env("CHATPIPE_ARCHIVE__GROUP", group)
        .env("CHATPIPE_ARCHIVE__RETENTION_INTERVAL_MS", "1000")
        .env("CHATPIPE_STORAGE__KEYSPACE", keyspace)
        .env(
            "CHATPIPE_STORAGE__REPLICATION",
            "{'class': 'SimpleStrategy', 'replication_factor': 1}",
        )
        .env(
            "CHATPIPE_STORAGE__HOT_RETENTION_S",
            args.hot_retention_s.to_string(),
        )
        .env("CHATPIPE_HTTP__METRICS_ADDR", "127.0.0.1:0")
        .env("RUST_LOG", "warn")
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))
}

/// Latencies (µs) of `--requests` pages of each kind, interleaved: hot, cold, straddling.
async fn pages(
    args: &Args,
    http: &reqwest::Client,
    base: &str,
    keys: &TokenKeys,
    conversations: &[i64],
    cold_through: i64,
) -> anyhow::Result<[Histogram<u64>; 3]> {
    let token = keys.issue(UserId::of(2), Duration::from_secs(7200));
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let mut plan = Vec::with_capacity(3 * args.requests);
    for _ in 0..args.requests {
        let conv = conversations[rng.random_range(0..conversations.len())];
        let deep = rng.random_range(PAGE + 1..=cold_through - PAGE);
        plan.push((
            0,
            format!("{base}/v1/conversations/{conv}/messages?limit={PAGE}"),
        ));
        plan.push((
            1,
            format!("{base}/v1/conversations/{conv}/messages?limit={PAGE}&beforeSeq={deep}"),
        ));
        let edge = cold_through + PAGE / 2;
        plan.push((
            2,
            format!("{base}/v1/conversations/{conv}/messages?limit={PAGE}&beforeSeq={edge}"),
        ));
    }
    let timed: Vec<anyhow::Result<(usize, u64)>> = futures::stream::iter(plan)
        .map(|(kind, url)| {
            let req = http.get(url).bearer_auth(&token);
            async move {
                let t = Instant::now();
                let page: serde_json::Value = req.send().await?.error_for_status()?.json().await?;
                let us = t.elapsed().as_micros() as u64;
                anyhow::ensure!(
                    page["messages"].as_array().map(Vec::len) == Some(PAGE as usize),
                    "a full page"
                );
                Ok((kind, us))
            }
        })
        .buffer_unordered(args.concurrency)
        .collect()
        .await;
    let mut h = [Histogram::new(3)?, Histogram::new(3)?, Histogram::new(3)?];
    for t in timed {
        let (kind, us) = t?;
        h[kind].record(us)?;
    }
    Ok(h)
}
