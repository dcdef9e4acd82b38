//! Commit-to-topic latency and burst drain time of the outbox path, on the real stack:
//! ingest-api -> PostgreSQL -> Debezium -> chat.events. A measurement, not a test.
//!
//!   cdc-latency --base http://127.0.0.1:8080 --secret-file .stack/jwt-secret
//!
//! Phase 1 sends `--messages` (1,000) one at a time and, for each, measures from the
//! 201 (the commit) to the moment this process reads the record from chat.events.
//! Phase 2 sends a burst of `--burst` (10,000) with 32 concurrent senders and measures
//! until the last of them is on the topic. Writes JSON with the machine.

use std::time::{Duration, Instant};

use anyhow::Context;
use chatpipe_core::auth::TokenKeys;
use chatpipe_core::UserId;
use chatpipe_tests::bench::{create_group, send, start_event_reader, wait_for, Arrivals};
use clap::Parser;
use hdrhistogram::Histogram;
use serde_json::json;

#[derive(Parser)]
struct Args {
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    base: String,
    #[arg(long, default_value = ".stack/jwt-secret")]
    secret_file: String,
    #[command(flatten)]
    stack: chatpipe_tests::bench::StackArgs,
    #[arg(long, default_value = "chat.events")]
    topic: String,
    #[arg(long, default_value_t = 1000)]
    messages: usize,
    #[arg(long, default_value_t = 10_000)]
    burst: usize,
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    #[arg(long, default_value = "target/bench/cdc-latency.json")]
    out: String,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let secret =
        std::fs::read_to_string(&args.secret_file).with_context(|| args.secret_file.clone())?;
    let keys = TokenKeys::new(&secret.trim().to_owned().into(), Duration::ZERO)?;
    let user = 2_000_000 + (chatpipe_core::auth::unix_now() % 1_000_000) as i64;
    let token = keys.issue(UserId::new(user).unwrap(), Duration::from_secs(3600));
    let http = reqwest::Client::new();

    let arrivals = Arrivals::default();
    let reader = start_event_reader(
        &args.stack.brokers,
        &args.stack.registry,
        &args.topic,
        arrivals.clone(),
    )
    .await?;

    // Phase 1: one at a time, commit -> topic.
    let conv = create_group(&http, &args.base, &token, &[]).await?;
    let mut latency = Histogram::<u64>::new_with_bounds(1, 600_000_000, 3)?;
    for _ in 0..args.messages {
        let (seq, committed) = send(&http, &args.base, &token, conv).await?;
        let arrived = wait_for(&arrivals, (conv, seq), Duration::from_secs(60)).await?;
        latency.record(
            arrived
                .saturating_duration_since(committed)
                .as_micros()
                .max(1) as u64,
        )?;
    }
    let ms = |q: f64| latency.value_at_quantile(q) as f64 / 1000.0;
    println!(
        "commit -> chat.events over {} messages: p50 {:.1} ms  p90 {:.1} ms  p99 {:.1} ms  max {:.1} ms",
        args.messages,
        ms(0.5),
        ms(0.9),
        ms(0.99),
        latency.max() as f64 / 1000.0
    );

    // Phase 2: a burst over `concurrency` conversations.
    let mut convs = Vec::new();
    for _ in 0..args.concurrency {
        convs.push(create_group(&http, &args.base, &token, &[]).await?);
    }
    let started = Instant::now();
    // Sender i sends burst/concurrency messages, the first burst%concurrency one more.
    let share =
        |i: usize| args.burst / args.concurrency + usize::from(i < args.burst % args.concurrency);
    let senders = convs.iter().enumerate().map(|(i, &c)| {
        let (http, base, token, n) = (http.clone(), args.base.clone(), token.clone(), share(i));
        tokio::spawn(async move {
            let mut last = None;
            for _ in 0..n {
                last = Some(send(&http, &base, &token, c).await?);
            }
            anyhow::Ok(last)
        })
    });
    let mut last_commit = started;
    let mut expected = Vec::new();
    for (c, s) in convs.iter().zip(futures::future::join_all(senders).await) {
        if let Some((seq, at)) = s?? {
            last_commit = last_commit.max(at);
            expected.push((*c, seq));
        }
    }
    let committed = started.elapsed();
    let mut landed = started;
    for key in expected {
        landed = landed.max(wait_for(&arrivals, key, Duration::from_secs(300)).await?);
    }
    let total = landed.duration_since(started);
    let drain = landed.saturating_duration_since(last_commit);
    let sent = args.burst;
    println!(
        "burst of {sent}: all committed after {:.2} s ({:.0}/s), all on chat.events after {:.2} s; last record {:.0} ms after the last commit",
        committed.as_secs_f64(),
        sent as f64 / committed.as_secs_f64(),
        total.as_secs_f64(),
        drain.as_secs_f64() * 1000.0
    );
    reader.abort();

    let report = json!({
        "benchmark": "cdc-latency",
        "latency_ms": {"messages": args.messages, "p50": ms(0.5), "p90": ms(0.9), "p99": ms(0.99), "max": latency.max() as f64 / 1000.0},
        "burst": {"messages": sent, "senders": args.concurrency, "committed_s": committed.as_secs_f64(),
                  "landed_s": total.as_secs_f64(), "drain_after_last_commit_ms": drain.as_secs_f64() * 1000.0},
        "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
    });
    if let Some(dir) = std::path::Path::new(&args.out).parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&args.out, serde_json::to_vec_pretty(&report)?)?;
    Ok(())
}
