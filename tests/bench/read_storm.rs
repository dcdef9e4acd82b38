//! Read storm: a 1,000-member group and 10,000 1:1 conversations whose members send many
//! receipts within seconds. The stream path (Kafka -> receipts aggregator -> one batched
//! UPDATE per window) against the article's path (one guarded UPDATE per receipt, the
//! baseline), in the same run, on the same data. A measurement, not a test.
//!
//!   eval "$(scripts/stack env)"; target/release/read-storm [--receipts 100000]

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use chatpipe_core::outbox::Outbox;
use chatpipe_core::{ConversationId, Seq, UserId};
use chatpipe_schemas::receipt::ReadReceipt;
use chatpipe_schemas::registry::Registry;
use clap::Parser;
use futures::StreamExt;
use ingest_api::store::Store;
use rand::{Rng, SeedableRng};
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde_json::json;
use sqlx::postgres::PgPoolOptions;
use sqlx::{Connection, Executor, PgConnection, PgPool};

#[derive(Parser)]
struct Args {
    #[arg(long, default_value_t = 100_000)]
    receipts: usize,
    #[arg(long, default_value_t = 1000)]
    group_members: i64,
    #[arg(long, default_value_t = 10_000)]
    directs: i64,
    /// Concurrent connections of the per-receipt baseline.
    #[arg(long, default_value_t = 16)]
    baseline_concurrency: usize,
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "postgres://postgres:postgres@127.0.0.1:5432/postgres"
    )]
    database_url: String,
    #[command(flatten)]
    stack: chatpipe_tests::bench::StackArgs,
    #[arg(long, default_value = "target/bench/read-storm.json")]
    out: String,
}

const LAST_SEQ: i64 = 100;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // Install the recorder before the processor counts its flushes.
    chatpipe_core::telemetry::metrics_handle();
    chatpipe_core::telemetry::init_logging();
    let run = format!("storm{}", chatpipe_core::auth::unix_now());
    let (db_url, pool) = fresh_database(&args.database_url, &run).await?;
    let members = seed(&pool, &args).await?;
    eprintln!(
        "seeded: {} members in 1 group + {} direct conversations",
        members.len(),
        args.directs
    );

    // The storm: receipts from random members, mostly moving forwards, some stale.
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut storm = Vec::with_capacity(args.receipts);
    let mut expected: HashMap<(i64, i64), i64> = HashMap::new();
    for _ in 0..args.receipts {
        let (conv, user) = members[rng.random_range(0..members.len())];
        let seq = rng.random_range(1..=LAST_SEQ + 20); // some past the end: clamped
        storm.push((conv, user, seq));
        let e = expected.entry((conv, user)).or_insert(0);
        *e = (*e).max(seq.min(LAST_SEQ));
    }
    load_expected(&pool, &expected).await?;

    let registry = Registry::new(&args.stack.registry, Duration::from_secs(5))?;
    let subject = format!("{run}.chat.events-value");
    let codec = registry.event_codec_for(&subject).await?;

    // --- the stream path -------------------------------------------------------------
    let topic = format!("{run}.chat.read-receipts");
    create_topic(&args.stack.brokers, &topic).await?;
    let receipt_codec = registry.receipt_codec().await?;
    let mut settings = pipeline::settings::Settings::load(None)?;
    settings.kafka.brokers = args.stack.brokers.clone();
    settings.registry.url = args.stack.registry.clone();
    settings.registry.events_subject = subject.clone();
    settings.database.url = db_url.clone();
    settings.receipts.topic = topic.clone();
    settings.receipts.group = format!("{run}-receipts");
    settings.outbox.delete_after_write = false;
    let stop = Arc::new(AtomicBool::new(false));
    let processor = {
        let (settings, stop) = (settings.clone(), stop.clone());
        std::thread::spawn(move || pipeline::receipts::run(&settings, stop))
    };
    let producer: FutureProducer =
        chatpipe_core::kafka::producer_config(&args.stack.brokers).create()?;
    let started = Instant::now();
    let sends = futures::stream::iter(storm.iter().map(|&(conv, user, seq)| {
        let bytes = receipt_codec.encode(&ReadReceipt {
            conversation_id: chatpipe_schemas::ConversationId::of(conv),
            user_id: chatpipe_schemas::UserId::of(user),
            seq: chatpipe_schemas::Seq::of(seq),
            at: chrono::Utc::now(),
        });
        let producer = producer.clone();
        let topic = topic.clone();
        async move {
            let key = conv.to_string();
            producer
                .send(
                    FutureRecord::to(&topic).key(&key).payload(&bytes),
                    Duration::from_secs(30),
                )
                .await
                .map(|_| ())
        }
    }))
    .buffer_unordered(10_000)
    .collect::<Vec<_>>()
    .await;
    anyhow::ensure!(
        sends.iter().all(Result::is_ok),
        "some receipts were not produced"
    );
    let produced = started.elapsed();
    wait_final(&pool, Duration::from_secs(600)).await?;
    let stream_converged = started.elapsed();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    processor.join().expect("processor thread")?;
    let metrics = chatpipe_core::telemetry::metrics_handle().render();
    let flushes = metric(&metrics, "receipts_flushes_total");
    let keys_flushed = metric(&metrics, "receipts_flush_keys_sum");
    eprintln!(
        "flush time: {:.2} s in {} flushes; receipts in: {}",
        metric(&metrics, "receipts_flush_duration_seconds_sum"),
        metric(&metrics, "receipts_flush_duration_seconds_count"),
        metric(&metrics, "receipts_in_total")
    );
    let stream_events = count(
        &pool,
        "SELECT count(*) FROM outbox WHERE type = 'read.updated'",
    )
    .await?;

    // --- the baseline: one guarded UPDATE (+ outbox row when it advanced) per receipt ----
    pool.execute("UPDATE conversation_member SET last_read_seq = 0; DELETE FROM outbox")
        .await?;
    let store = Store {
        pool: pool.clone(),
        outbox: Outbox::new(codec, false),
    };
    let started = Instant::now();
    futures::stream::iter(storm.iter().map(|&(conv, user, seq)| {
        let store = store.clone();
        async move {
            ingest_api::store::reads::mark_read(
                &store,
                ConversationId::new(conv).unwrap(),
                UserId::new(user).unwrap(),
                Seq::new(seq).unwrap(),
            )
            .await
            .map(|_| ())
        }
    }))
    .buffer_unordered(args.baseline_concurrency)
    .collect::<Vec<_>>()
    .await
    .into_iter()
    .collect::<Result<Vec<_>, _>>()
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    let baseline = started.elapsed();
    wait_final(&pool, Duration::from_secs(5)).await?;
    let baseline_events = count(
        &pool,
        "SELECT count(*) FROM outbox WHERE type = 'read.updated'",
    )
    .await?;

    let n = args.receipts as f64;
    let report = json!({
        "benchmark": "read-storm",
        "receipts": args.receipts, "members": members.len(), "distinct_members_in_storm": expected.len(),
        "stream": {
            "produce_s": produced.as_secs_f64(), "converged_s": stream_converged.as_secs_f64(),
            "receipts_per_s": n / stream_converged.as_secs_f64(), "update_statements": flushes,
            "collapse_ratio": n / keys_flushed, "read_updated_events": stream_events,
        },
        "baseline_per_receipt": {
            "converged_s": baseline.as_secs_f64(), "receipts_per_s": n / baseline.as_secs_f64(),
            "update_statements": args.receipts, "concurrency": args.baseline_concurrency,
            "read_updated_events": baseline_events,
        },
        "stream_speedup": baseline.as_secs_f64() / stream_converged.as_secs_f64(),
        "stream_final_after_last_produce_s": (stream_converged - produced).as_secs_f64(),
        "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
    });
    if let Some(dir) = std::path::Path::new(&args.out).parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&args.out, serde_json::to_vec_pretty(&report)?)?;
    println!(
        "stream:   {:>7.0} receipts/s absorbed, every watermark final after {:.2} s, {} UPDATE statements ({:.1}/s), collapse ratio {:.1}, {} read.updated",
        n / stream_converged.as_secs_f64(),
        stream_converged.as_secs_f64(),
        flushes,
        flushes / stream_converged.as_secs_f64(),
        n / keys_flushed,
        stream_events
    );
    println!(
        "baseline: {:>7.0} receipts/s, every watermark final after {:.2} s, {} UPDATE statements ({:.0}/s), {} read.updated",
        n / baseline.as_secs_f64(),
        baseline.as_secs_f64(),
        args.receipts,
        n / baseline.as_secs_f64(),
        baseline_events
    );
    println!(
        "stream: receipts produced in {:.2} s; every watermark final {:.2} s after the last one was produced",
        produced.as_secs_f64(),
        (stream_converged - produced).as_secs_f64()
    );
    println!(
        "stream converges {:.2}x faster than one UPDATE per receipt   report: {}",
        baseline.as_secs_f64() / stream_converged.as_secs_f64(),
        args.out
    );
    drop_database(&args.database_url, &run).await?;
    Ok(())
}

fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

async fn count(pool: &PgPool, sql: &str) -> anyhow::Result<i64> {
    Ok(sqlx::query_scalar(sql).fetch_one(pool).await?)
}

async fn fresh_database(server: &str, name: &str) -> anyhow::Result<(String, PgPool)> {
    let mut admin = PgConnection::connect(server).await.context("PostgreSQL")?;
    admin
        .execute(format!("CREATE DATABASE \"{name}\"").as_str())
        .await?;
    let url = format!(
        "{}/{name}",
        server.rsplit_once('/').map_or(server, |(b, _)| b)
    );
    let pool = PgPoolOptions::new()
        .max_connections(20)
        .connect(&url)
        .await?;
    ingest_api::startup::MIGRATOR.run(&pool).await?;
    Ok((url, pool))
}

async fn drop_database(server: &str, name: &str) -> anyhow::Result<()> {
    let mut admin = PgConnection::connect(server).await?;
    admin
        .execute(format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)").as_str())
        .await?;
    Ok(())
}

/// The conversations and members, written directly (last_seq = 100, no message rows:
/// the watermark UPDATE reads only conversation.last_seq). Returns (conversation, user).
async fn seed(pool: &PgPool, args: &Args) -> anyhow::Result<Vec<(i64, i64)>> {
    let group: i64 = sqlx::query_scalar(
        "INSERT INTO conversation (type, title, created_by, last_seq, member_count) VALUES ('GROUP', 'storm', 1, $1, $2) RETURNING id",
    )
    .bind(LAST_SEQ)
    .bind(args.group_members as i32)
    .fetch_one(pool)
    .await?;
    sqlx::query("INSERT INTO conversation_member (conversation_id, user_id) SELECT $1, u FROM generate_series(1, $2) u")
        .bind(group)
        .bind(args.group_members)
        .execute(pool)
        .await?;
    sqlx::query(
        "WITH c AS (
             INSERT INTO conversation (type, created_by, last_seq, member_count)
             SELECT 'DIRECT', 100000 + i, $1, 2 FROM generate_series(1, $2) i RETURNING id, created_by
         )
         INSERT INTO conversation_member (conversation_id, user_id)
         SELECT id, created_by FROM c UNION ALL SELECT id, created_by + 500000 FROM c",
    )
    .bind(LAST_SEQ)
    .bind(args.directs)
    .execute(pool)
    .await?;
    Ok(
        sqlx::query_as("SELECT conversation_id, user_id FROM conversation_member")
            .fetch_all(pool)
            .await?,
    )
}

async fn load_expected(pool: &PgPool, expected: &HashMap<(i64, i64), i64>) -> anyhow::Result<()> {
    let (mut c, mut u, mut s) = (Vec::new(), Vec::new(), Vec::new());
    for (&(conv, user), &seq) in expected {
        c.push(conv);
        u.push(user);
        s.push(seq);
    }
    sqlx::query(
        "CREATE TABLE bench_expected AS SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::bigint[]) AS e(conversation_id, user_id, seq)",
    )
    .bind(&c)
    .bind(&u)
    .bind(&s)
    .execute(pool)
    .await?;
    Ok(())
}

/// Polls until every member's watermark equals the highest (clamped) seq it sent.
async fn wait_final(pool: &PgPool, limit: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + limit;
    loop {
        let pending = count(
            pool,
            "SELECT count(*) FROM bench_expected e JOIN conversation_member m USING (conversation_id, user_id)
              WHERE m.last_read_seq <> e.seq",
        )
        .await?;
        if pending == 0 {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{pending} watermarks not final after {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn create_topic(brokers: &str, topic: &str) -> anyhow::Result<()> {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    let admin: AdminClient<rdkafka::client::DefaultClientContext> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()?;
    for r in admin
        .create_topics(
            &[NewTopic::new(topic, 6, TopicReplication::Fixed(1))],
            &AdminOptions::new(),
        )
        .await?
    {
        r.map_err(|(t, e)| anyhow::anyhow!("{t}: {e}"))?;
    }
    Ok(())
}
